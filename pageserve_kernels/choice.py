"""Pick the fastest of several implementations of one op by timing them on this host, once.

Which path wins depends on the CPU under us (an AVX2-only EPYC prefers our panel
GEMM at every row count; an AVX-512 Xeon prefers oneDNN from 16 rows up), so a
caller hands `choose` its candidates as zero-argument closures that run the op on
representative inputs, and gets back the name of the fastest. The answer is
cached on disk (`<cache>/choices/<host>.json`), keyed by the host (CPU model and
flags, torch version, thread count, and a digest of this package's kernel sources,
so a changed kernel is timed anew) and the caller's own key (op, dtype, shape,
rows), so later starts pay nothing. Every pick is logged with its measured times.

PAGESERVE_KERNEL_CHOICE="linear=onednn,fused_rms_norm=torch" forces a choice per
op kind (a name the op does not offer is an error, not a silent fallback).
PAGESERVE_KERNEL_RETUNE=1 measures again and overwrites what is cached.
A timing during which other processes kept more than half a core busy
(pageserve_kernels/host_load.py) is noise: its pick is used but stored as `busy`, and the
first later start that finds the host quiet measures it again (a test suite's picks never
outlive it into a benchmark).
This module knows nothing about which ops exist.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pageserve_kernels import host_load
from pageserve_kernels.cpu_features import cpu_flags_line
from pageserve_kernels.isa_cap import cpu_model

log = logging.getLogger("pageserve.kernels")

FORCE_ENV = "PAGESERVE_KERNEL_CHOICE"
RETUNE_ENV = "PAGESERVE_KERNEL_RETUNE"
MIN_ROUNDS = 3
MAX_ROUNDS = 200
BUDGET_S = 0.1  # per choice: keeps a first start's tuning to seconds
WALL_CAP_S = 1.0  # a busy host gives noisier picks, not a slower start


class ChoiceError(ValueError):
    """A forced choice names an implementation the op does not have."""


@dataclass(frozen=True)
class Choice:
    pick: str
    seconds: dict[str, float] = field(default_factory=dict)  # measured best time of each (empty when forced)
    how: str = "measured"  # "measured", "cached", "forced" or "only"
    busy: bool = False  # measured while other processes competed for the cores


def forced(kind: str) -> str | None:
    """The implementation PAGESERVE_KERNEL_CHOICE names for this op kind, if any."""
    for item in os.environ.get(FORCE_ENV, "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == kind and value.strip():
            return value.strip()
    return None


def host_key() -> str:
    """What makes timings of this host comparable: CPU model and flags, torch version, threads, and
    the kernels' code (a changed kernel or reference is timed anew, not judged by its old rate)."""
    parts = [cpu_model(), cpu_flags_line(), torch.__version__, str(torch.get_num_threads()), kernels_code_digest()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@functools.cache
def kernels_code_digest() -> str:
    """A digest of this package's Python and C sources: the candidates every choice times."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted([*root.glob("*.py"), *root.glob("csrc/*")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def measure(candidates: Mapping[str, Callable[[], object]], min_rounds: int = MIN_ROUNDS,
            budget_s: float = BUDGET_S) -> dict[str, float]:
    """Best seconds of each candidate over interleaved rounds.

    The best of many samples is what the op costs when the scheduler leaves us alone: on a
    shared host one OpenMP thread descheduled for a time slice turns a 0.1 ms call into 100 ms,
    so rounds continue until the *clean* cost (best times the rounds) reaches `budget_s`, up
    to MAX_ROUNDS, with WALL_CAP_S of wall time at most.
    """
    best = {name: float("inf") for name in candidates}
    for fn in candidates.values():
        fn()  # warm-up: first-touch pages, oneDNN primitive creation
    began, rounds = time.perf_counter(), 0
    while rounds < MAX_ROUNDS:
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
        rounds += 1
        clean = sum(best.values()) * rounds
        if rounds >= min_rounds and (clean >= budget_s or time.perf_counter() - began > WALL_CAP_S):
            break
    return best


Timers = Mapping[str, Callable[[], object]]


def choose(kind: str, key: str, names: Sequence[str], timers: Callable[[], Timers],
           measure_fn: Callable[[Timers], dict[str, float]] = measure) -> Choice:
    """The fastest of `names` for (kind, key) on this host: forced, cached, or measured now.

    `timers()` builds the closures to time (called only when measuring: inputs cost memory);
    `key` must name everything the timing depends on besides the host (dtype, shapes, rows).
    """
    if not names:
        raise ChoiceError(f"{kind}: no candidates")
    want = forced(kind)
    if want is not None:
        if want not in names:
            raise ChoiceError(f"{FORCE_ENV} forces {kind}={want}, but {kind} offers {sorted(names)}")
        return Choice(want, how="forced")
    if len(names) == 1:
        return Choice(names[0], how="only")
    full_key = f"{kind}|{key}"
    store = _load()
    cached = None if os.environ.get(RETUNE_ENV) == "1" else store.get(full_key)
    usable = cached is not None and cached.get("pick") in names and set(cached.get("seconds", {})) == set(names)
    if usable and not (cached.get("busy") and host_load.quiet_now()):  # a busy pick waits for a quiet start
        return Choice(str(cached["pick"]), dict(cached["seconds"]), "cached", bool(cached.get("busy")))
    seconds, others = host_load.others_cores(lambda: measure_fn(timers()))
    busy = others is not None and others > host_load.BUSY_CORES
    pick = min(seconds, key=seconds.__getitem__)
    (log.warning if busy else log.info)(
        "%s %s: picked %s (%s)%s", kind, key, pick,
        ", ".join(f"{n} {s * 1e3:.3f} ms" for n, s in sorted(seconds.items(), key=lambda kv: kv[1])),
        f"; other processes used {others:.1f} cores meanwhile: measured again on a quiet start" if busy else "")
    store[full_key] = {"pick": pick, "seconds": seconds, **({"busy": True} if busy else {})}
    _save(store)
    return Choice(pick, seconds, busy=busy)


def cached_choices() -> dict[str, dict]:
    """Every choice recorded for this host: "kind|key" -> {"pick", "seconds"} (for reports)."""
    return _load()


def _path() -> Path:
    from shared.model_store import cache_dir  # shared/ imports no torch: no loop

    return cache_dir() / "choices" / f"{host_key()}.json"


def _load() -> dict[str, dict]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(store: dict[str, dict]) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**_load(), **store}  # another process may have added choices meanwhile
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(merged, f, indent=1, sort_keys=True)
    os.replace(f.name, path)  # atomic: readers never see half a file
