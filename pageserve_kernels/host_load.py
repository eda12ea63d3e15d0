"""How much of the host's CPU other processes used while we timed something (Linux /proc/stat).

Timings taken while another process competes for the cores are noise: a per-host pick
(pageserve_kernels/choice.py) measured during a test suite or beside a build can choose the
slower kernel and, cached on disk, keep it for every later start. `Busy.measuring(fn)` runs
`fn` and reports, beside its result, how many cores' worth of CPU *other* processes took
meanwhile: the whole host's busy time from /proc/stat minus this process's own CPU time
(all its threads), over the wall time. Steal time counts as busy: a hypervisor that takes
the core away disturbs a timing as much as a neighbour does. Off Linux the answer is None
(unknown), and callers keep their old behaviour. This module knows nothing about kernels.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

BUSY_CORES = 0.5
"""Other processes using more than this many cores during a timing make it untrustworthy."""
QUIET_PROBE_S = 0.1

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_seconds() -> float | None:
    """The host's busy CPU seconds since boot, summed over cores (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    guest = sum(ticks[8:10])  # guest time is already counted in user and nice
    return (sum(ticks) - idle - guest) / _TICKS


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def others_cores(fn: Callable[[], T]) -> tuple[T, float | None]:
    """fn()'s result, and the cores other processes kept busy meanwhile (None: unknown)."""
    busy0, own0, wall0 = _busy_seconds(), _own_seconds(), time.perf_counter()
    result = fn()
    busy1, own1, wall = _busy_seconds(), _own_seconds(), time.perf_counter() - wall0
    if busy0 is None or busy1 is None or wall <= 0:
        return result, None
    # Both clocks count whole ticks (10 ms): take off what rounding alone could add (a tick per
    # core for the host, one for us), so a short quiet timing never reads as a busy one.
    slack = ((os.cpu_count() or 1) + 1) / _TICKS
    return result, max(0.0, (busy1 - busy0) - (own1 - own0) - slack) / wall


@functools.cache
def quiet_now() -> bool:
    """Whether other processes leave the host's cores alone right now (probed once per process).

    Unknown (off Linux) counts as quiet: nothing better can be learned by waiting.
    """
    _, cores = others_cores(lambda: time.sleep(QUIET_PROBE_S))
    return cores is None or cores <= BUSY_CORES
