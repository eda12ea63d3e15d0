"""What this CPU computes natively, read from /proc/cpuinfo (Linux; empty elsewhere).

Half-precision products only pay off with hardware for them: without AVX512-BF16
or AMX, oneDNN emulates bfloat16 and runs it far slower than float32 (measured on
an AVX2-only EPYC: bfloat16 F.linear 5-9 GFLOP/s against 80-140 for float32).
PAGESERVE_CPU_ISA=avx2 hides the wider flags, to take an AVX2-only host's paths here (isa_cap.py).
"""

from __future__ import annotations

import torch

from pageserve_kernels import isa_cap

# flags any one of which gives the dtype's products real hardware
FAST_MATMUL_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


def cpu_flags_line() -> str:
    """The first `flags` line of /proc/cpuinfo, less what PAGESERVE_CPU_ISA hides (isa_cap.py); "" where none."""
    return isa_cap.visible_flags_line()


def cpu_flags() -> frozenset[str]:
    return frozenset(cpu_flags_line().partition(":")[2].split())


def has_avx2_fma() -> bool:
    """What the hand-vectorised C kernels (cpu_gemm, cpu_prefill) are written for."""
    return {"avx2", "fma"} <= cpu_flags()


def has_bf16_hardware() -> bool:
    """AVX512-BF16 or AMX: bfloat16 products in hardware (unknown flags count as no)."""
    return any(f in cpu_flags() for f in FAST_MATMUL_FLAGS[torch.bfloat16])


def has_fast_matmul(dtype: torch.dtype) -> bool:
    """True for float32, and for a half type when this CPU has hardware for its products.
    Unknown (no /proc/cpuinfo) counts as fast: no warning on what we cannot see."""
    wanted = FAST_MATMUL_FLAGS.get(dtype)
    flags = cpu_flags()
    return wanted is None or not flags or any(f in flags for f in wanted)
