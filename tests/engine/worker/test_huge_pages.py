"""The CPU KV pool sits on transparent huge pages (engine/worker/host_allocator.py, kv_cache.py).

Each case builds a pool in a fresh interpreter and reads the kernel's own account of the mapping
that holds it (/proc/self/smaps, AnonHugePages), so what is checked is the memory, not a call.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

PROBE = textwrap.dedent("""
    import torch
    from engine.worker.kv_cache import CacheLayout, KVCache

    layout = CacheLayout(block_size=16, num_device_blocks=2048, num_cpu_blocks=1, num_layers=4, num_kv_heads=2,
                         head_dim=64, dtype=torch.bfloat16)  # 64 MiB: more than glibc's largest heap request
    pool = KVCache(layout).device_pool
    first, last = pool.data_ptr(), pool.data_ptr() + pool.numel() * pool.element_size()
    huge_kb = 0  # summed over every mapping the pool overlaps: madvise splits its head and tail off
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            overlaps = start < last and first < end
        elif overlaps and head[0] == "AnonHugePages:":
            huge_kb += int(head[1])
    assert pool.abs().sum() == 0  # zero-filled as before
    print(huge_kb)
""")


def _mode() -> str | None:
    if not THP_MODE.exists():
        return None
    found = re.search(r"\[(\w+)\]", THP_MODE.read_text())
    return found.group(1) if found else None


def _pool_huge_kb(switch: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("PAGESERVE_HUGE_PAGES", "THP_MEM_ALLOC_ENABLE")}
    if switch is not None:
        env["PAGESERVE_HUGE_PAGES"] = switch
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


needs_thp = pytest.mark.skipif(_mode() in (None, "never"), reason="this kernel gives no transparent huge pages")


@needs_thp
def test_the_cpu_kv_pool_is_on_huge_pages() -> None:
    assert _pool_huge_kb(None) >= 32 * 1024  # at least half of the 64 MiB pool (page-faults may fall back)


@needs_thp
def test_the_switch_leaves_the_kernel_default() -> None:
    expected_huge = _mode() == "always"  # Debian's default is madvise: nothing huge unless asked
    assert (_pool_huge_kb("0") > 0) == expected_huge
