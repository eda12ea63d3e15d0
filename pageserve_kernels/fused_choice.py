"""Whether a fused layer op runs its C kernel or PyTorch here: measured once per (op, dtype, row width).

The C kernels (pageserve_kernels/cpu_fused.py, pageserve_kernels/cpu_fused_bf16.py) win on most hosts, but
not every op on every CPU (measured on an AVX-512 Xeon: bfloat16 SiLU-and-mul about even
with PyTorch at 64 rows, add+RMSNorm 2.7x faster). The first call of an op for a dtype and
width times both on 64 rows of that width through pageserve_kernels/choice.py (cached on disk per
host, `PAGESERVE_KERNEL_CHOICE=fused_<op>=c|torch` forces one); later calls look up a dict.
Times the C kernels against pageserve_kernels/fused_reference.py (fused_ops.py imports this module).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pageserve_kernels import choice

ROWS = 64  # a decode batch: the calls a step makes most often
_PICKS: dict[tuple[str, torch.dtype, tuple[int, ...]], bool] = {}


def native_wins(op: str, native: object, dtype: torch.dtype, tail: tuple[int, ...]) -> bool:
    """Whether the C kernel of `op` for a `dtype` model and rows of shape `tail` is the faster here."""
    key = (op, dtype, tail)
    pick = _PICKS.get(key)
    if pick is None:
        name = str(dtype).removeprefix("torch.")
        made = choice.choose(f"fused_{op}", f"{name} width={list(tail)} rows={ROWS}", ["c", "torch"],
                             lambda: _timers(op, native, dtype, tail))
        pick = _PICKS[key] = made.pick == "c"
    return pick


def _timers(op: str, native: object, dtype: torch.dtype, tail: tuple[int, ...]) -> dict[str, Callable[[], object]]:
    from pageserve_kernels import fused_reference as f

    def rand(*shape: int, as_dtype: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape).to(as_dtype)

    x = rand(ROWS, *tail)
    if op == "rms_norm":  # its input is the float32 residual stream
        stream, w = rand(ROWS, *tail, as_dtype=torch.float32), rand(tail[-1])
        return {"c": lambda: native.rms_norm(stream, w, 1e-5),  # type: ignore[attr-defined]
                "torch": lambda: f.rms_norm_reference(stream, w, 1e-5)}
    if op == "add_rms_norm":
        r, w = rand(ROWS, *tail, as_dtype=torch.float32), rand(tail[-1])
        return {"c": lambda: native.add_rms_norm_(x, r, w, 1e-5),  # type: ignore[attr-defined]
                "torch": lambda: f.fused_add_rms_norm_reference(x, r, w, 1e-5)}
    if op == "silu_and_mul":
        return {"c": lambda: native.silu_and_mul(x),  # type: ignore[attr-defined]
                "torch": lambda: f.silu_and_mul_reference(x)}
    if op == "rotary":
        cos, sin = rand(ROWS, 1, tail[-1], as_dtype=torch.float32), rand(ROWS, 1, tail[-1], as_dtype=torch.float32)
        return {"c": lambda: native.rotary_(x, cos, sin),  # type: ignore[attr-defined]
                "torch": lambda: f.rotary_reference(x, cos, sin)}
    raise ValueError(f"no fused op {op!r}")
