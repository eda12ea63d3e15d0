"""Keep a step's freed temporaries in the process: glibc malloc tuned for a model forward.

Every step allocates the same large temporaries again (a prompt step's gate/up product
is 12 MB at 2,048 tokens in bfloat16). Out of the box glibc serves each request above its
mmap threshold (128 KiB, adapting up to 32 MiB) with a fresh mmap, unmaps it on free,
and trims its heap's free top above 128 KiB: each step then faults its temporaries in
and zeroes them page by page again. On the AMX Xeon (2 vCPUs) that was 11.7 s of system
time in a 43 s bfloat16 `pageserve bench offline` run; with both knobs below the same run
went from 451 to 553 output tok/s (either knob alone: no gain; jemalloc preloaded: 484).
vLLM gets this by preloading tcmalloc; `mallopt` does it in-process, with no preload and
no environment to set before start: requests up to 32 MiB (glibc's ceiling for the
threshold) come from the heap, and up to 1 GiB of freed heap top is kept for reuse.
The process keeps its peak heap; an engine's working set is its steady state anyway.

Set once per process that runs a model (ModelRunner); a no-op off glibc or with
PAGESERVE_KEEP_FREED_BUFFERS=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
HEAP_UP_TO = 32 << 20  # glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
KEEP_FREED_TOP = 1 << 30


@functools.cache
def keep_freed_buffers() -> bool:
    """True when glibc took both settings."""
    if os.environ.get("PAGESERVE_KEEP_FREED_BUFFERS", "1") == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, HEAP_UP_TO)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_TOP))


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        getattr(libc, "gnu_get_libc_version")  # only glibc has mallopt with these meanings  # noqa: B009
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
