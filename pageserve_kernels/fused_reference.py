"""The layers' elementwise ops in plain PyTorch: the fallback for other dtypes and devices, and the
definition the C kernels (pageserve_kernels/cpu_fused.py, cpu_fused_bf16.py) are tested and timed against
(pageserve_kernels/fused_choice.py). Imports nothing of ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (T, H): the float32 residual stream (or the model dtype); returns the weight's dtype."""
    if x.dtype == weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(weight.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual (float32) + x (the model dtype) -> (rms_norm(residual) in the weight's dtype, residual)."""
    residual = residual + x.to(residual.dtype)
    return rms_norm_reference(residual, weight, eps), residual


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    i = gate_up.shape[-1] // 2
    return (F.silu(gate_up[..., :i].float()) * gate_up[..., i:].float()).to(gate_up.dtype)


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * [cos | cos] + [x2 | x1] * [-sin | sin] with float32 tables; a new contiguous tensor of x's dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    swapped = torch.cat((x32[..., half:], x32[..., :half]), dim=-1)  # [x2 | x1]
    return (x32 * cos + swapped * sin_signed).to(x.dtype)


def exact_logits_reference(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bits: int,
                           k: int) -> torch.Tensor:
    """logits (N, V), the vocab product rounded to `bits` significand bits, -> (N, V) float32 where each value
    within one unit in the last place of its row's finite maximum is the float32 product of hidden (N, H) and
    its weight row (V, H); a row with more than k such values (a flat row) keeps the rounded values."""
    out = logits.float()
    row_max = out.max(dim=1, keepdim=True).values  # NaN where a row has one: no candidates there
    _, exponent = torch.frexp(row_max)
    threshold = row_max - torch.ldexp(torch.ones_like(row_max), exponent - bits)
    hits = (out >= threshold) & torch.isfinite(row_max)
    hits &= hits.sum(dim=1, keepdim=True) <= k
    rows, cols = torch.nonzero(hits, as_tuple=True)
    out[rows, cols] = (hidden[rows].float() * weight[cols].float()).sum(dim=1)
    return out
