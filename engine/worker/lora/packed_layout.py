"""Where a checked adapter's packed tensors live in its one buffer, and the C call that fills them.

    buffer (serving dtype, 64-byte aligned parts):
    [ layer 0 qkv: A blocks | B_q panels | B_k panels | B_v panels ][ layer 0 o: A | B_o ] ... [ layer L-1 down ]

Every part is a view of the one buffer (the adapter's ProjectionLora and LoraSlice hold them; the entry table
holds their addresses), filled by one pageserve_kernels/lora_pack.py call straight from the file's bytes:
no torch tensor per stored tensor, no GIL while the bytes move. Only plans; adapter.py has checked every
shape, rank and target before (a plan on unchecked shapes would be an assertion, never a user's error).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import torch

from engine.worker.lora.prefaulted_pages import Pages, mapped
from engine.worker.lora.safetensors_file import StoredTensor
from pageserve_kernels import cpu_lora, lora_pack
from pageserve_kernels.cpu_gemm import PANEL

Target = tuple[int, int, StoredTensor, StoredTensor, float]
"""(first output column, end column, lora_A (r, K), lora_B (end - start, r), scale) of one checked target."""


def a_shape(rank: int, width: int, dtype: torch.dtype) -> tuple[int, ...]:
    """cpu_lora.pack_a's blocks of a stacked A (rank, width): (ceil(R/4), ceil(K/w), 4, w)."""
    w = cpu_lora.A_BLOCK[dtype]
    return (-(-rank // 4), -(-width // w), 4, w)


def panels_shape(n: int, r: int, dtype: torch.dtype) -> tuple[int, ...]:
    """cpu_gemm.pack_panels' panels of a B (n, r): float32 (ceil(n/16), r, 16), bfloat16 (ceil(n/32), ceil(r/2), 32, 2)."""
    p = PANEL[dtype]
    return (-(-n // p), r, p) if dtype == torch.float32 else (-(-n // p), -(-r // 2), p, 2)


class _Plan:
    """Parts of the buffer handed out in order, and the jobs that fill them."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype, self.item = dtype, dtype.itemsize
        self.used = 0  # elements
        self.jobs: list[list[int]] = []
        self.parts: list[tuple[int, tuple[int, ...]]] = []

    def part(self, shape: tuple[int, ...]) -> int:
        """A new part of `shape`; returns its index (its byte offset is aligned to lora_pack.ALIGN)."""
        step = lora_pack.ALIGN // self.item
        self.used = -(-self.used // step) * step
        self.parts.append((self.used, shape))
        self.used += math.prod(shape)
        return len(self.parts) - 1

    def job(self, kind: int, tensor: StoredTensor, part: int, row0: int = 0, total: int = 0, scale: float = 1.0) -> None:
        rows, cols = tensor.shape
        bits = struct.unpack("<I", struct.pack("<f", scale))[0]  # as PyTorch's float32 b * scale casts it
        self.jobs.append([kind, tensor.offset, lora_pack.SOURCE_DTYPES[tensor.dtype], rows, cols,
                          self.parts[part][0] * self.item, row0, total, bits])


def bound_bytes(stored: dict[str, StoredTensor], dtype: torch.dtype) -> int:
    """At least the bytes pack_projections lays these tensors out in, from the header alone (nothing checked
    yet): each lora_A as a stack of its own (a stack pads its rows once, so no more), each other tensor as B
    panels, every part aligned as the plan aligns it, and one alignment more for where the parts' order differs."""
    plan = _Plan(dtype)
    for name, tensor in stored.items():
        rows, cols = (tensor.shape + (1, 1))[:2]
        plan.part(a_shape(rows, cols, dtype) if "lora_A" in name else panels_shape(rows, cols, dtype))
    return plan.used * plan.item + lora_pack.ALIGN


def pack_projections(data: torch.Tensor, projections: Sequence[dict[str, list[Target]]], dtype: torch.dtype,
                     packer: lora_pack.LoraPacker, pages: Pages | None = None
                     ) -> list[dict[str, tuple[torch.Tensor, list[torch.Tensor]]]]:
    """Per layer, projection -> (its stacked A packed, each target's B panels in order), all views of one
    buffer filled from `data` ((file size,) uint8: the file) by one C call; the buffer on `pages` (mapped and
    faulted in while the file was read) where they are enough."""
    plan = _Plan(dtype)
    parts: list[dict[str, tuple[int, list[int]]]] = []
    for layer in projections:
        placed = {}
        for name, targets in layer.items():
            rank = sum(a.shape[0] for _, _, a, _, _ in targets)
            a_part = plan.part(a_shape(rank, targets[0][2].shape[1], dtype))
            row0 = 0
            for _, _, a, _, _ in targets:
                plan.job(lora_pack.KIND_A, a, a_part, row0, rank)
                row0 += a.shape[0]
            b_parts = []
            for start, end, _, b, scale in targets:
                b_parts.append(plan.part(panels_shape(end - start, b.shape[1], dtype)))
                plan.job(lora_pack.KIND_B, b, b_parts[-1], scale=scale)
            placed[name] = (a_part, b_parts)
        parts.append(placed)
    out = _own_mapping(max(plan.used, 1), dtype, pages)  # (elements,) every element of a view written by the call
    packer.pack(data, out, torch.tensor(plan.jobs, dtype=torch.int64).view(-1, lora_pack.JOB_FIELDS))
    views = [out[offset : offset + math.prod(shape)].view(shape) for offset, shape in plan.parts]
    return [{name: (views[a], [views[b] for b in bs]) for name, (a, bs) in layer.items()} for layer in parts]


def _own_mapping(numel: int, dtype: torch.dtype, pages: Pages | None = None) -> torch.Tensor:
    """(numel,) of `dtype` on pages of its own (prefaulted_pages.py: never malloc's heap), returned to the system
    when the adapter's last view goes: `pages` where they are enough, else fresh ones."""
    nbytes = numel * dtype.itemsize
    taken = pages.take(nbytes) if pages is not None else None
    return (taken if taken is not None else mapped(nbytes)[:nbytes]).view(dtype)
