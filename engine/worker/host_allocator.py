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

The CPU KV pool goes on transparent huge pages (`zeros_on_huge_pages`). Decode attention reads
a step's blocks from anywhere in a pool of hundreds of MB, 2-6 KB at a time: with 4 KiB pages
nearly every block is a TLB miss (a Zen 4 core's 3,072 L2 TLB entries cover 12 MB), with 2 MiB
pages the whole pool is ~250 entries. Debian's kernels default to THP only where a region asks
(`madvise`), and torch's own switch (THP_MEM_ALLOC_ENABLE) is read once, at the process's first
allocation, before the engine can set it; so the pool is advised here, before its first touch.
`python -m ops.bench.kernels.cpu_decode --rounds 20 --dtype bfloat16` (577 MB of K/V a step), runs
alternated, PAGESERVE_HUGE_PAGES=0 against 1: AMD EPYC Zen 4 (2 vCPUs) 29.4, 30.9, 28.1 ms a step against
27.7, 28.4, 26.0; Intel Xeon with AMX (2 vCPUs) 48.6, 50.0 against 42.9, 42.7.
PAGESERVE_HUGE_PAGES=0 leaves the pool on the kernel's default pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import torch

MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
HUGE_PAGE = 2 << 20  # x86-64 and aarch64 (4 KiB base pages)
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


def return_freed_memory() -> bool:
    """malloc_trim(0): the heap's free pages back to the system, those between chunks still in use too (glibc
    advises them away), not only its top. Once, after loading: loading a checkpoint frees as much as the
    weights (the file's copy, the unpacked weights), much of it between packed weights that stay, which the
    top-only trim above never returns (Qwen3-1.7B's shape: 0.7 GiB). False off glibc or when nothing was freed."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def _glibc() -> ctypes.CDLL | None:
    libc = _libc()
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):  # only glibc's mallopt has these meanings
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose whole 2 MiB pages were advised to be huge before their first touch."""
    pool = torch.empty(shape, dtype=dtype)
    if os.environ.get("PAGESERVE_HUGE_PAGES", "1") != "0":
        advise_huge_pages(pool.data_ptr(), pool.numel() * pool.element_size())
    return pool.zero_()


def advise_huge_pages(address: int, length: int) -> bool:
    """madvise(MADV_HUGEPAGE) on the 2 MiB pages that lie wholly inside [address, address + length).

    False where there is none or the kernel refused (no THP, not Linux): the memory stays as it was."""
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + length) // HUGE_PAGE * HUGE_PAGE
    libc = _libc()
    if end <= start or libc is None:
        return False
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name is not None else None
    except OSError:
        return None
