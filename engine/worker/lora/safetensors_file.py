"""An adapter_model.safetensors read whole, and its header: each tensor's dtype, shape and bytes, nothing copied.

    [ u64 little-endian: header length N | N bytes of JSON | tensor bytes ... ]
    JSON: {"name": {"dtype": "F32", "shape": [r, k], "data_offsets": [begin, end]}, "__metadata__": {...}}

The format is documented and trivial (huggingface/safetensors); parsing the header here lets
pageserve_kernels/lora_pack.py read the tensors straight out of the file's bytes, with no torch tensor per
tensor. Offsets are checked against the file; a malformed file is a LoraError. Knows nothing about LoRA.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.worker.lora.errors import LoraError
from engine.worker.lora.prefaulted_pages import PAGE, mapped

ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class StoredTensor:
    dtype: str
    """safetensors' name of its dtype ("F32", "BF16", "F16", ...)."""
    shape: tuple[int, ...]
    offset: int
    """Byte offset of its first element in the whole file."""


_spare = threading.Lock()
_kept: list[torch.Tensor] = []
"""One buffer, the largest file read yet, for the next read: a fresh 50 MB buffer faults its pages in during
the read and unmaps them after (TLB shootdowns on every core), and while loads ran back to back that cost the
running streams' p99 inter-token latency 108-111 -> 70-72 ms and the load median 136 -> 117-124 ms
(`pageserve bench lora-load`, Zen 4, 2 vCPUs). Whoever finds it taken reads into fresh memory."""


@contextlib.contextmanager
def read_file(path: Path) -> Iterator[torch.Tensor]:
    """(file size,) uint8: the file's bytes, read whole by one plain read (which releases the GIL while the disk
    works), valid inside the block only. Never a bytearray: it is zeroed first, 50 MB under the GIL (54 ms)."""
    mine = _spare.acquire(blocking=False)
    try:
        yield _read(path, _kept if mine else [])
    finally:
        if mine:
            _spare.release()


def _read(path: Path, kept: list[torch.Tensor]) -> torch.Tensor:
    try:
        size = path.stat().st_size
        room = -(-size // PAGE) * PAGE
        if not kept or kept[0].numel() < room:
            kept[:] = [mapped(room)]  # page aligned, as O_DIRECT reads need
        got = _read_direct(path, kept[0][:room], size)
        if got is None:  # a file system without O_DIRECT (tmpfs): through the page cache
            with path.open("rb", buffering=0) as f:
                got = f.readinto(as_buffer(kept[0][:size])) if size else 0
    except OSError as e:
        raise LoraError(f"{path}: unreadable ({e})") from None
    if got != size:
        raise LoraError(f"{path}: read {got} of {size} bytes (the file changed while read)")
    return kept[0][:size]


def _read_direct(path: Path, into: torch.Tensor, size: int) -> int | None:
    """Read the file with O_DIRECT: the disk writes into `into` itself, no copy out of the page cache and no
    page cache filled (a cold 50 MB read through it cost the running streams' steps the copy and the page
    allocations). None where the file system refuses O_DIRECT."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    try:
        got, view = 0, as_buffer(into)
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n <= 0:
                break
            got += n
        return min(got, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def as_buffer(data: torch.Tensor) -> memoryview:
    """A 1-D uint8 tensor's bytes as a writable buffer, nothing copied (torch tensors export no buffer)."""
    assert data.dtype == torch.uint8 and data.dim() == 1 and data.is_contiguous()
    if not data.numel():
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * data.numel()).from_address(data.data_ptr())).cast("B")


def read_header(path: Path, data: torch.Tensor, file_size: int | None = None) -> dict[str, StoredTensor]:
    """Tensor name -> where it lies in `data` (the whole file, or its first bytes with the file's `file_size`);
    LoraError for anything malformed."""
    raw = as_buffer(data)
    file_bytes = len(raw) if file_size is None else file_size
    if len(raw) < 8:
        raise LoraError(f"{path}: unreadable (shorter than a safetensors header)")
    (length,) = struct.unpack_from("<Q", raw)
    if length > len(raw) - 8:
        raise LoraError(f"{path}: unreadable (header of {length} bytes in a file of {len(raw)})")
    try:
        header = json.loads(bytes(raw[8 : 8 + length]))
    except ValueError as e:
        raise LoraError(f"{path}: unreadable (header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise LoraError(f"{path}: unreadable (header is not a JSON object)")
    tensors, base = {}, 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(n) for n in info["shape"]), info["data_offsets"]
            size = ITEM_BYTES[dtype] * math.prod(shape)
        except (KeyError, TypeError, ValueError):
            raise LoraError(f"{path}: unreadable (tensor {name!r}: {info!r})") from None
        if not (isinstance(begin, int) and isinstance(end, int) and begin >= 0 and end - begin == size
                and base + end <= file_bytes):
            raise LoraError(f"{path}: unreadable (tensor {name!r}'s bytes {begin}..{end} do not hold {dtype} "
                            f"{list(shape)} inside the file)")
        tensors[name] = StoredTensor(dtype, shape, base + begin)
    return tensors


@dataclass(frozen=True)
class Header:
    """A file's header read before the file itself (peek_header), to be reused for the whole read's bytes."""

    tensors: dict[str, StoredTensor]
    raw: bytes
    """The file's first bytes: the header's length and its JSON."""
    file_size: int

    def describes(self, data: torch.Tensor) -> bool:
        """Whether `data` (the whole file, read since) has this header and size: the file did not change."""
        return data.numel() == self.file_size and bytes(as_buffer(data)[: len(self.raw)]) == self.raw


def peek_header(path: Path) -> Header | None:
    """The header alone, by a small read before the file is read whole (the packed buffer is sized by it,
    prefaulted_pages.py); None for anything unusual (the whole read then reports it)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(1 << 16)
            (length,) = struct.unpack_from("<Q", head) if len(head) >= 8 else (1 << 62,)
            if 8 + length > len(head):
                head += f.read(8 + length - len(head)) if length < (1 << 27) else b""
        tensors = read_header(path, torch.frombuffer(bytearray(head), dtype=torch.uint8), file_size=size)
    except (OSError, LoraError):
        return None
    return Header(tensors, head[: 8 + length], size)
