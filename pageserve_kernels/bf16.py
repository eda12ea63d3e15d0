"""Round-to-nearest-even float -> bfloat16 inside a kernel, for the interpreter.

Triton 3.9's interpreter truncates float32 -> bfloat16 conversions (even with
fp_downcast_rounding="rtne") where a GPU and torch round to nearest even, so a
kernel storing bf16 would differ from torch by one unit in the last place. The
kernels call `store_cast` with EXACT_BF16 set only when interpreting, so the
compiled GPU path keeps its native conversion.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_bf16(x):
    """x (any float) -> bfloat16 with round-to-nearest-even, by integer arithmetic."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def store_cast(x, dtype: tl.constexpr, EXACT_BF16: tl.constexpr):
    """x converted to dtype for a store, rounding like torch when EXACT_BF16."""
    if EXACT_BF16 and dtype == tl.bfloat16:
        return round_to_bf16(x)
    return x.to(dtype)
