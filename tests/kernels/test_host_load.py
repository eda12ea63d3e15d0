"""pageserve_kernels/host_load.py: another process spinning on a core is seen; our own work is not.

Each case compares against a baseline taken the same way just before, so load from elsewhere on
the host (a benchmark, CI's own processes) shifts both readings alike.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pageserve_kernels import host_load

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _others(fn) -> float:
    _, cores = host_load.others_cores(fn)
    assert cores is not None
    return cores


def test_a_spinning_neighbour_counts_as_busy() -> None:
    baseline = _others(lambda: time.sleep(0.5))
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        with_neighbour = _others(lambda: time.sleep(0.5))
    finally:
        neighbour.kill()
        neighbour.wait()
    assert with_neighbour > baseline + host_load.BUSY_CORES


def test_our_own_spinning_is_not_a_neighbour() -> None:
    """This process's CPU time is taken off: our own busy loop adds (nearly) nothing."""
    baseline = _others(lambda: time.sleep(0.5))
    assert _others(lambda: _spin(0.5)) < baseline + host_load.BUSY_CORES
