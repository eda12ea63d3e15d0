"""Linear products with weights prepacked once, on the path this host runs fastest.

Candidates for a (N, K) weight, each timed by pageserve_kernels/choice.py at engine start
for every row bucket (decode batches 1-64, prompt steps 256-2048) and cached on
disk per host:
  - "panel": our GEMM over column panels (pageserve_kernels/cpu_gemm.py), batch-invariant:
    float32 on AVX2 (the fastest on AVX2-only hosts at every size), bfloat16 on AVX512-BF16
    (1.1-1.6x oneDNN at decode batches on an AMD EPYC Zen 4);
  - "amx": the same panels multiplied on AMX tiles (bfloat16, hosts with AMX-BF16): ahead of oneDNN
    up to about 64 rows on an Intel Xeon with AMX (pageserve_kernels/cpu_gemm.py has the numbers);
  - "onednn": oneDNN's blocked layout (float32 and bfloat16): on AVX-512/AMX hosts
    the faster one from about 16 rows up;
  - "torch": F.linear (MKL for float32): the fallback everywhere.
A second packed copy (it costs the weight's memory again) is kept only for a candidate at
least SWITCH_GAIN faster than the main path in some bucket; each bucket then runs the
fastest of the copies kept. Where memory is short the model packs every weight on one layout
(`one_copy`, decided for the whole model in engine/worker/models/decoder.py): at 1.7B parameters
in bfloat16 on an AMD EPYC Zen 4 every projection kept panels for 1-4 rows and oneDNN's layout
from 16 up, 5.6 GB of weights instead of 2.8.
PAGESERVE_KERNEL_CHOICE=linear=<name> forces one path. This module knows nothing
about which weights it multiplies.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pageserve_kernels import choice, cpu_gemm

log = logging.getLogger("pageserve.engine")

BATCH_HINT = 64  # decode batches: the shape oneDNN's packing is tuned for
ROW_BUCKETS = (1, 4, 16, 64, 256, 2048)  # decode batch sizes, then prompt steps
SWITCH_GAIN = 1.10
MAX_TIMED_FLOP = 8e9  # larger buckets take the choice of the largest one timed
WARM_BYTES = 48 << 20  # decode buckets cycle through this many bytes of weight copies: out of cache, as in a step

Product = Callable[[torch.Tensor], torch.Tensor]
LAYOUT = {"amx": "panel"}  # implementations that multiply another's packed weight: one copy serves both


def layout_of(impl: str) -> str:
    """The packed weight `impl` multiplies: its own, or (LAYOUT) the one it shares with another implementation."""
    return LAYOUT.get(impl, impl)


@dataclass(frozen=True)
class LinearPlan:
    """One weight's packed forms and which of them each row count uses."""

    upper_rows: tuple[int, ...]  # bucket i covers rows up to upper_rows[i] (the last: any)
    impls: tuple[str, ...]  # the implementation of each bucket
    packed: dict[str, object]  # layout (LAYOUT, else the implementation) -> its packed weight (None for "torch")

    def impl_for(self, rows: int) -> str:
        return self.impls[min(bisect.bisect_left(self.upper_rows, rows), len(self.impls) - 1)]


Packed = LinearPlan

_PLANS: dict[tuple[int, int, torch.dtype], tuple[str, ...]] = {}  # one choice per shape in a process


def candidates(dtype: torch.dtype) -> list[str]:
    """The implementations this host can run for this dtype, on the CPU."""
    names = []
    if cpu_gemm.load(dtype) is not None:
        names.append("panel")
    if dtype == torch.bfloat16 and cpu_gemm.load_amx() is not None:
        names.append("amx")
    if dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available():
        names.append("onednn")
    names.append("torch")
    return names


def pack(weight: torch.Tensor, one_copy: bool = False) -> Packed | None:
    """The weight's plan, or None where F.linear is the only path (other devices). `one_copy`: every bucket
    on the layout most buckets use (one_layout), so the weight is held once."""
    impls = _impls(weight)
    if impls is None:
        return None
    if one_copy:
        impls = one_layout(impls)
    packed = {layout: _pack_as(layout, weight) for layout in {layout_of(name) for name in impls}}
    return LinearPlan(_upper_rows(), impls, packed)


def pack_in_place(weight: torch.Tensor, one_copy: bool = False) -> Packed | None:
    """pack(weight), and the raw weight's memory freed where no row bucket reads it (every bucket runs a
    packed copy): the weight's bytes once instead of twice. Its dtype stays, its elements go; call once,
    after loading (engine/worker/model_loader.py). A weight that is also read elsewhere (a tied lm_head,
    the embedding) must use `pack` instead."""
    plan = pack(weight, one_copy)
    if plan is not None and "torch" not in plan.impls:
        weight.data = weight.data.new_empty(0)
    return plan


def second_copy_bytes(weight: torch.Tensor) -> int:
    """What packing `weight` costs beyond one copy of it: its bytes once per layout past the first (the raw
    weight counts as one where a bucket multiplies it). Times the candidates if this shape was not yet."""
    impls = _impls(weight)
    return 0 if impls is None else weight.nbytes * (len({layout_of(name) for name in impls}) - 1)


def one_layout(impls: tuple[str, ...]) -> tuple[str, ...]:
    """The plan on one packed copy: the layout most buckets use keeps its buckets, and the others take its
    most-picked implementation (ties: the prompt buckets' layout)."""
    layouts = [layout_of(name) for name in impls]
    main = max(set(layouts), key=lambda layout: (layouts.count(layout), layout == layouts[-1]))
    on_main = [name for name in impls if layout_of(name) == main]
    fallback = max(set(on_main), key=on_main.count)
    return tuple(name if layout_of(name) == main else fallback for name in impls)


def _impls(weight: torch.Tensor) -> tuple[str, ...] | None:
    """Each row bucket's implementation for this weight's shape (chosen once a process), or None off the CPU."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        return None
    key = (weight.shape[0], weight.shape[1], weight.dtype)
    if key not in _PLANS:
        _PLANS[key] = choose_impls(weight.shape[0], weight.shape[1], weight.dtype)
    return _PLANS[key]


def choose_impls(n: int, k: int, dtype: torch.dtype) -> tuple[str, ...]:
    """Each row bucket's implementation for a (N, K) weight: measured (or cached) per bucket."""
    names = [c for c in candidates(dtype) if _packs(c, dtype)]
    timed: dict[int, dict[str, float]] = {}
    picks: list[str] = []
    for rows in ROW_BUCKETS:
        if timed and 2 * rows * n * k > MAX_TIMED_FLOP:
            picks.append(picks[-1])
            continue
        key = f"{str(dtype).removeprefix('torch.')} N={n} K={k} rows={rows}"
        picked = choice.choose("linear", key, names, lambda rows=rows: _timers(names, n, k, dtype, rows))
        picks.append(picked.pick)
        timed[rows] = picked.seconds
    impls = _with_hysteresis(picks, timed)
    log.info("linear %s (%d x %d): %s", str(dtype).removeprefix("torch."), n, k, ", ".join(
        f"{rows} rows {impl}" + (f" {2 * rows * n * k / timed[rows][impl] / 1e9:.0f} GFLOP/s"
                                 if impl in timed.get(rows, {}) else "")
        for rows, impl in zip(ROW_BUCKETS, impls, strict=True)))
    return impls


def _with_hysteresis(picks: list[str], timed: dict[int, dict[str, float]]) -> tuple[str, ...]:
    """Which packed copies to keep, then each bucket's fastest of them. Kept: the most-picked
    implementation, and any other that some bucket measured SWITCH_GAIN faster than it (a copy
    worth its memory there). A bucket that was not timed takes the bucket before it."""
    main = max(set(picks), key=lambda name: (picks.count(name), name == picks[-1]))
    kept = {main}
    for rows, pick in zip(ROW_BUCKETS, picks, strict=True):
        s = timed.get(rows, {})
        if main in s and pick in s and s[pick] > 0 and s[main] / s[pick] >= SWITCH_GAIN:
            kept.add(pick)
    out: list[str] = []
    for rows in ROW_BUCKETS:
        s = timed.get(rows, {})
        measured = [name for name in sorted(kept) if name in s]
        out.append(min(measured, key=s.__getitem__) if measured else out[-1] if out else main)
    return tuple(out)


def _upper_rows() -> tuple[int, ...]:
    """Bucket bounds halfway (in log scale) between the timed row counts."""
    return tuple(int((a * b) ** 0.5) for a, b in zip(ROW_BUCKETS, ROW_BUCKETS[1:], strict=False))


def _packs(name: str, dtype: torch.dtype) -> bool:
    try:
        _pack_as(layout_of(name), torch.zeros(16, 16, dtype=dtype))
    except (RuntimeError, AttributeError):
        return False
    return True


def _pack_as(name: str, weight: torch.Tensor) -> object:
    if name == "panel":
        return cpu_gemm.pack_panels(weight)
    if name == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
    return None


def _timers(names: list[str], n: int, k: int, dtype: torch.dtype, rows: int) -> dict[str, Callable[[], object]]:
    """One call per sample, each on the next of enough weight copies to leave the cache (decode rows;
    as in a step, where every layer has its own weights) or on one copy (prompt rows). Short samples:
    on a busy host the best of many short ones is far likelier to be clean than of a few long ones."""
    copies = max(1, min(8, WARM_BYTES // (n * k * dtype.itemsize))) if rows <= 64 else 1
    weights = [torch.randn(n, k).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, k).to(dtype)
    out = {}
    for name in names:
        layout = layout_of(name)
        plans = [LinearPlan((), (name,), {layout: _pack_as(layout, w)}) for w in weights]
        turn = itertools.cycle(list(zip(weights, plans, strict=True)))
        out[name] = lambda turn=turn: linear(x, *next(turn))
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, packed: Packed | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (T, K) -> (T, N)
    if packed is None:
        return F.linear(x, weight, bias)
    impl = packed.impl_for(x.shape[0])
    if layout_of(impl) == "panel" and x.dtype == weight.dtype:
        native = cpu_gemm.load(x.dtype) if impl == "panel" else cpu_gemm.load_amx()
        assert native is not None  # a panel plan exists only where the kernel loaded
        return native.linear(x, packed.packed["panel"], bias)  # type: ignore[arg-type]
    if impl == "onednn" and x.dtype == weight.dtype:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.packed["onednn"], bias, "none", [], "")
    return F.linear(x, weight, bias)
