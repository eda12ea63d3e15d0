"""An adapter's packed buffer, mapped and faulted in on a thread of its own while the disk reads the file.

A fresh 25 MB anonymous mapping costs ~9 ms of page faults and zeroing on first touch (Zen 4, 2 vCPUs):
inside the C layout call (packed_layout.py), that was 15 of its 22 ms per 50 MB adapter, after the read.
The header (a small read, safetensors_file.peek_header) bounds the packed size before the file is read
(packed_layout.bound_bytes), so the mapping is made with MAP_POPULATE beside the O_DIRECT read, which leaves the
CPU idle while the disk works; the unused tail is unmapped when the exact size is known. mmap/munmap through
ctypes, which releases the GIL for the call (Python's mmap module holds it while populating). `mapped` is the
same memory faulted in on first touch (the read buffer's, and the layout's where no Pages were made). Knows
nothing about LoRA.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
import weakref

import torch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype, _libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype, _libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def whole_pages(nbytes: int) -> int:
    """nbytes rounded up to whole pages, at least one (what a mapping of nbytes takes)."""
    return max(PAGE, math.ceil(nbytes / PAGE) * PAGE)


def mapped(nbytes: int) -> torch.Tensor:
    """(nbytes rounded up to whole pages,) uint8 on anonymous pages of its own, page aligned, unmapped when its
    last view goes; faulted in on first touch. Not malloc: the engine keeps malloc's freed memory for a step's
    temporaries (engine/worker/host_allocator.py: up to 32 MiB from the heap), and a 25 MB adapter buffer left
    on that heap slowed the running streams' steps for good (baseline p99 inter-token latency 24 -> 700-1,300
    ms, `pageserve bench lora-load`, Zen 4); on their own pages they run as before any load."""
    return torch.frombuffer(mmap.mmap(-1, whole_pages(nbytes)), dtype=torch.uint8)


class Pages:
    """nbytes of anonymous memory mapped and faulted in on a thread started here; `take` the first n bytes as
    a tensor that unmaps them when its last view goes, or `release` them unused."""

    def __init__(self, nbytes: int) -> None:
        self.size = whole_pages(nbytes)
        self._address: int | None = None
        self._thread = threading.Thread(target=self._map, name="lora-pages", daemon=True)
        self._thread.start()

    def _map(self) -> None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        address = _libc.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        self._address = None if address in (None, _FAILED) else address

    def take(self, nbytes: int) -> torch.Tensor | None:
        """(nbytes,) uint8 on these pages (the tail past it unmapped), or None where they are too few or the
        mapping failed (then nothing is held)."""
        self._thread.join()
        address, self._address = self._address, None
        if address is None:
            return None
        used = whole_pages(nbytes)
        if used > self.size:
            _libc.munmap(address, self.size)
            return None
        if used < self.size:
            _libc.munmap(address + used, self.size - used)
        memory = (ctypes.c_char * nbytes).from_address(address)
        weakref.finalize(memory, _libc.munmap, address, used)  # torch.frombuffer keeps `memory` alive
        return torch.frombuffer(memory, dtype=torch.uint8, count=nbytes)

    def release(self) -> None:
        """Unmap the pages if nobody took them (a load that failed its checks)."""
        self._thread.join()
        address, self._address = self._address, None
        if address is not None:
            _libc.munmap(address, self.size)
