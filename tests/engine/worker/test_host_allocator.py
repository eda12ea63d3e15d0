"""The engine keeps a step's large freed temporaries in the heap (engine/worker/host_allocator.py).

Each case runs in a fresh interpreter: mallopt settings are process-wide and one-way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    from engine.worker import host_allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    if sys.argv[1] == "runner":  # as the engine does it: building a model runner sets it
        import torch
        from types import SimpleNamespace
        from engine.worker.model_runner import ModelRunner
        import os
        os.environ["PAGESERVE_KERNEL_CHOICE"] = "prefill_attention=c"  # nothing to time for a fake model
        kv = SimpleNamespace(device_pool=SimpleNamespace(device=torch.device("cpu")),
                             layout=SimpleNamespace(block_size=16, dtype=torch.float32, num_kv_heads=2, head_dim=32))
        ModelRunner(SimpleNamespace(shape=SimpleNamespace(num_heads=4)), kv, None)
        took = host_allocator.keep_freed_buffers.cache_info().currsize  # called once already?
    else:
        took = host_allocator.keep_freed_buffers()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    p = libc.malloc(16 << 20)  # a prompt step's temporary: above glibc's default mmap threshold
    mapped = libc.mallinfo2().hblks - before
    libc.free(p)
    print(int(took), mapped)
""")


def _probe(keep: str | None, how: str = "direct") -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "PAGESERVE_KEEP_FREED_BUFFERS"}
    if keep is not None:
        env["PAGESERVE_KEEP_FREED_BUFFERS"] = keep
    out = subprocess.run([sys.executable, "-c", PROBE, how], env=env, capture_output=True, text=True, check=True)
    took, mapped = out.stdout.split()
    return int(took), int(mapped)


def _glibc() -> bool:
    return os.confstr("CS_GNU_LIBC_VERSION") is not None if hasattr(os, "confstr") else False


@pytest.mark.skipif(not _glibc(), reason="the settings are glibc's")
def test_large_temporaries_come_from_the_heap_once_set() -> None:
    assert _probe(None) == (1, 0)  # set: a 16 MB block is heap memory, kept for reuse when freed


@pytest.mark.skipif(not _glibc(), reason="the settings are glibc's")
def test_the_environment_switch_leaves_glibc_as_it_was() -> None:
    assert _probe("0") == (0, 1)  # glibc's default: the same block is a fresh mmap, unmapped on free


@pytest.mark.skipif(not _glibc(), reason="the settings are glibc's")
def test_building_a_model_runner_sets_it() -> None:
    """Every process that runs a model gets it through the runner, so no entry point can forget it."""
    assert _probe(None, "runner") == (1, 0)


TRIM_PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    from engine.worker import host_allocator

    host_allocator.keep_freed_buffers()  # the engine's settings: a freed top under 1 GiB is kept
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def anon_mib():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) // 1024

    blocks = [libc.malloc(4 << 20) for _ in range(100)]  # 400 MiB of heap, as a load's weights and copies
    for p in blocks:
        ctypes.memset(p, 1, 4 << 20)
    for p in blocks[::2]:
        libc.free(p)  # every other one freed: holes between blocks in use, no free top to trim
    before = anon_mib()
    returned = host_allocator.return_freed_memory() if sys.argv[1] == "trim" else False
    print(int(returned), before - anon_mib())
""")


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
@pytest.mark.parametrize("how", ["trim", "keep"])
def test_freed_memory_between_live_blocks_goes_back_to_the_system(how: str) -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE, how], capture_output=True, text=True, check=True)
    returned, mib = map(int, out.stdout.split())
    if how == "trim":
        assert returned == 1 and mib >= 150, out.stdout  # ~200 MiB of holes
    else:
        assert returned == 0 and mib < 20, out.stdout  # without it the holes stay resident
