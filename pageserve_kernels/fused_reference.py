"""The layers' elementwise ops in plain PyTorch: the fallback for other dtypes and devices, and the
definition the C kernels (pageserve_kernels/cpu_fused.py, cpu_fused_bf16.py) are tested and timed against
(pageserve_kernels/fused_choice.py). Imports nothing of ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # Half precision: normalise in float32, round, then scale (what HF does, so outputs match).
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    residual = residual + x
    return rms_norm_reference(residual, weight, eps), residual


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    i = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :i]) * gate_up[..., i:]


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * [cos | cos] + [x2 | x1] * [-sin | sin]; returns a new contiguous tensor."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # [x2 | x1]
    return x * cos + swapped * sin_signed
