"""The elementwise ops of a Llama layer for bfloat16 in C (pageserve_kernels/csrc/fused_bf16.c), one pass each.

The bfloat16 twin of pageserve_kernels/cpu_fused.py, for the same four ops: add + RMSNorm,
RMSNorm, SiLU-and-mul, rotary. PyTorch runs each as several bfloat16 kernels with a
temporary per step (norms, SiLU and rotary took 2.8 s of a 30 s bfloat16 run on an
AVX-512 Xeon); here each is one loop, arithmetic in float32 and each result rounded
to bfloat16 where the reference (pageserve_kernels/fused_ops.py) rounds it. Portable C under
`omp simd`, vectorised by the compiler for the host (-march=native). Results equal the
reference's except where the norm's float32 sum order moves a value by one bfloat16 unit.

Compiled on first use (pageserve_kernels/native_build.py); without a compiler, or with
PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and fused_ops keeps PyTorch.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pageserve_kernels import native_build


class NativeFusedBf16:
    """ctypes bindings; each call checks shapes, strides and dtypes first."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i, f, n = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        signatures = {
            "rms_norm_bf16": [p, i, p, p, i, i, f, n],
            "add_rms_norm_bf16": [p, p, p, i, i, f, n],
            "silu_and_mul_bf16": [p, i, p, i, i, n],
            "rotary_bf16": [p, i, p, p, i, i, i, i, n],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, argtypes
        self._lib = lib

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # (T, H) -> (T, H)
        t, h = x.shape
        _check_rows(x, weight)
        out = torch.empty((t, h), dtype=x.dtype)
        self._lib.rms_norm_bf16(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), t, h, eps, _threads())
        return out

    def add_rms_norm_(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        """residual += x; x = rms_norm(residual) * weight; both (T, H) contiguous, overwritten."""
        _check_rows(x, weight)
        assert x.is_contiguous() and residual.is_contiguous() and residual.shape == x.shape
        assert residual.dtype == torch.bfloat16
        t, h = x.shape
        self._lib.add_rms_norm_bf16(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), t, h, eps, _threads())

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # (T, 2 I) -> (T, I)
        t, two_i = gate_up.shape
        assert gate_up.dtype == torch.bfloat16 and gate_up.stride(1) == 1 and two_i % 2 == 0
        out = torch.empty((t, two_i // 2), dtype=gate_up.dtype)
        self._lib.silu_and_mul_bf16(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), t, two_i // 2,
                                    _threads())
        return out

    def rotary_(self, qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> None:
        """qk (T, heads, hd), heads contiguous, rotated in place; cos, sin_signed (T, 1, hd) or (T, hd)."""
        t, heads, hd = qk.shape
        cos, sin_signed = cos.reshape(t, hd), sin_signed.reshape(t, hd)
        assert qk.dtype == cos.dtype == sin_signed.dtype == torch.bfloat16 and hd % 2 == 0
        assert qk.stride(2) == 1 and qk.stride(1) == hd
        assert cos.stride(1) == sin_signed.stride(1) == 1 and cos.stride(0) == sin_signed.stride(0)
        self._lib.rotary_bf16(qk.data_ptr(), qk.stride(0), cos.data_ptr(), sin_signed.data_ptr(), cos.stride(0), t,
                              heads, hd, _threads())


def _check_rows(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dtype == weight.dtype == torch.bfloat16 and x.dim() == 2 and x.stride(1) == 1
    assert weight.is_contiguous() and weight.shape == (x.shape[1],)


def _threads() -> int:
    return torch.get_num_threads()


@functools.cache
def load() -> NativeFusedBf16 | None:
    """The compiled kernels, or None when disabled or no C compiler works here."""
    lib = native_build.try_load_kernel("fused_bf16", (*native_build.EXACT_FLAGS, "-mprefer-vector-width=512"))
    return None if lib is None else NativeFusedBf16(lib)
