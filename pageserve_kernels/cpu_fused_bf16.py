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

import functools

import torch

from pageserve_kernels import native_build
from pageserve_kernels.cpu_fused import NativeFused  # the bindings: the same signatures, suffix _bf16


@functools.cache
def load() -> NativeFused | None:
    """The compiled kernels, or None when disabled or no C compiler works here."""
    lib = native_build.try_load_kernel("fused_bf16", (*native_build.EXACT_FLAGS, "-mprefer-vector-width=512"))
    return None if lib is None else NativeFused(lib, torch.bfloat16, "bf16")
