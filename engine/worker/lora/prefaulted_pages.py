"""An adapter's packed buffer, mapped and faulted in on a thread of its own while the disk reads the file.

A fresh 25 MB anonymous mapping costs ~9 ms of page faults and zeroing on first touch (Zen 4, 2 vCPUs):
inside the C layout call (packed_layout.py), that was 15 of its 22 ms per 50 MB adapter, after the read.
The header (a small read, safetensors_file.peek_header) bounds the packed size before the file is read
(bound_bytes), so the mapping is made with MAP_POPULATE beside the O_DIRECT read, which leaves the CPU idle
while the disk works; the unused tail is unmapped when the exact size is known. mmap/munmap through ctypes,
which releases the GIL for the call (Python's mmap module holds it while populating). Knows nothing about LoRA
beyond the layout's bounds.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
import weakref

import torch

from engine.worker.lora.safetensors_file import StoredTensor
from pageserve_kernels import cpu_lora, lora_pack
from pageserve_kernels.cpu_gemm import PANEL

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype, _libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype, _libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def bound_bytes(stored: dict[str, StoredTensor], dtype: torch.dtype) -> int:
    """At least the packed layout's bytes (packed_layout.pack_projections) for these tensors: each A padded to
    4 rows and one vector of k by itself (a stack pads once), each B to whole panels, each part aligned."""
    w, panel, item = cpu_lora.A_BLOCK[dtype], PANEL[dtype], torch.tensor([], dtype=dtype).element_size()
    total = 0
    for name, t in stored.items():
        rows, cols = (t.shape + (1, 1))[:2]
        if "lora_A" in name:
            total += -(-rows // 4) * 4 * -(-cols // w) * w
        else:
            total += -(-rows // panel) * panel * (-(-cols // 2) * 2 if dtype == torch.bfloat16 else cols)
        total = -(-total * item // lora_pack.ALIGN) * lora_pack.ALIGN // item  # each part starts aligned
    return total * item + lora_pack.ALIGN


class Pages:
    """nbytes of anonymous memory mapped and faulted in on a thread started here; `take` the first n bytes as
    a tensor that unmaps them when its last view goes, or `release` them unused."""

    def __init__(self, nbytes: int) -> None:
        self.size = max(PAGE, math.ceil(nbytes / PAGE) * PAGE)
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
        used = max(PAGE, math.ceil(nbytes / PAGE) * PAGE)
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
