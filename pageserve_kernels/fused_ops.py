"""The layers' elementwise ops: the C kernels (pageserve_kernels/cpu_fused.py, float32; pageserve_kernels/cpu_fused_bf16.py,
bfloat16) where they apply, else PyTorch.

Each op has its PyTorch reference (`*_reference`, pageserve_kernels/fused_reference.py): the fallback for other
dtypes and devices, without a compiler or with PAGESERVE_NATIVE_KERNELS=0, and
what the tests compare the kernels with. The C path gives the same float32
results as the references (bit for bit on AVX2; see pageserve_kernels/cpu_fused.py).

In-place contract: `fused_add_rms_norm` and `rotate_qk` may overwrite their
inputs (the C path does, the references do not); callers use the returned
tensors and never read the inputs again.
"""

from __future__ import annotations

import torch

from pageserve_kernels import cpu_fused, cpu_fused_bf16, fused_choice
from pageserve_kernels.cpu_fused import NativeFused
from pageserve_kernels.fused_reference import (  # re-exported: the layers' fallback, the tests' yardstick
    exact_logits_reference,
    fused_add_rms_norm_reference,
    rms_norm_reference,
    rotary_reference,
    silu_and_mul_reference,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # (T, H) -> (T, H)
    """x: the float32 residual stream; the output is in the model's (the weight's) dtype."""
    native = _native(x, weight.dtype, "rms_norm")
    if native is None or x.dim() != 2 or x.stride(1) != 1 or x.dtype != torch.float32:
        return rms_norm_reference(x, weight, eps)
    return native.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:  # (T, H) x2 -> normed, new residual
    """residual = residual + x; returns (rms_norm(residual), residual): one pass instead of two ops.
    x in the model dtype, residual float32 (the stream)."""
    native = _native(x, x.dtype, "add_rms_norm")
    if (native is None or x.dim() != 2 or residual.dtype != torch.float32
            or not (x.is_contiguous() and residual.is_contiguous())):
        return fused_add_rms_norm_reference(x, residual, weight, eps)
    native.add_rms_norm_(x, residual, weight, eps)
    return x, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # (T, 2 I) -> (T, I)
    native = _native(gate_up, gate_up.dtype, "silu_and_mul")
    if native is None or gate_up.dim() != 2 or gate_up.stride(1) != 1:
        return silu_and_mul_reference(gate_up)
    return native.silu_and_mul(gate_up)


def rotate_qk(qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """qk (T, heads, hd) rotated by its rows' angles; cos, sin_signed (T, 1, hd) float32 from RotaryEmbedding.lookup."""
    native = _native(qk, qk.dtype, "rotary")
    if (native is None or qk.dim() != 3 or qk.stride(2) != 1 or qk.stride(1) != qk.shape[2]
            or cos.dtype != torch.float32):
        return rotary_reference(qk, cos, sin_signed)
    native.rotary_(qk, cos, sin_signed)
    return qk


def argmax_rows(x: torch.Tensor) -> torch.Tensor:  # (N, V) -> (N,) int64
    """Each row's first index of its maximum (NaN counts as the maximum), as torch.argmax(-1)."""
    native = _native(x, x.dtype, "")
    if native is None or not native.has_argmax or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] == 0:
        return x.argmax(-1)
    return native.argmax(x)


NEAR_MAX_LISTED = 8
"""Most candidates a row may have for its maximum before refining it is not worth it (a flat row)."""


def exact_logits(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bits: int) -> torch.Tensor:
    """logits (N, V) = hidden (N, H) @ weight (V, H)^T rounded to `bits` significand bits -> (N, V) float32,
    each row's values within one ulp of its maximum recomputed in float32 (fused_reference.exact_logits_reference).
    One C pass for bfloat16 where it loaded (converting, scanning and refining 64 x 49,152 logits in torch's
    ops cost about 1 ms of a decode step), the reference elsewhere."""
    native = _native(logits, logits.dtype, "")
    if (native is None or not native.has_exact_logits or logits.dim() != 2 or logits.shape[1] == 0
            or logits.stride(1) != 1 or hidden.stride(1) != 1 or weight.stride(1) != 1
            or not (logits.dtype == hidden.dtype == weight.dtype)):
        return exact_logits_reference(logits, hidden, weight, bits, NEAR_MAX_LISTED)
    return native.exact_logits(logits, hidden, weight, bits, NEAR_MAX_LISTED)


def _native(x: torch.Tensor, dtype: torch.dtype, op: str) -> NativeFused | None:
    """The C kernels of a `dtype` model (float32 or bfloat16) when x is on the CPU, built here, and
    measured faster than PyTorch for this op, dtype and x's row width on this host (fused_choice.py)."""
    if not x.is_cpu:  # is_cpu: 3x cheaper than device.type, ~120 calls a step
        return None
    native: NativeFused | None = None
    if dtype == torch.float32:
        native = cpu_fused.load()
    elif dtype == torch.bfloat16:
        native = cpu_fused_bf16.load()
    if native is None or not op:
        return native
    return native if fused_choice.native_wins(op, native, dtype, tuple(x.shape[1:])) else None
