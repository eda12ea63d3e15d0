"""One step's rows grouped by adapter, and the LoRA term each projection adds for them.

    rows (step order):  [ d0 d1 d2 d3 | p0 p0 p0 p1 p1 ]      adapter per row: [ a 0 b a | b b b 0 0 ]
    groups:             a -> rows {0, 3}   b -> rows {2, 4, 5, 6}       (base rows: in no group)

Per group and projection (Punica's shrink/expand split, in PyTorch: the reference for any kernel):
    s = x[rows] A_stack^T                (n, r_total)    one shrink product per group
    out[rows, slice] += s[:, r cols] B^T (n, slice)      one expand product per targeted slice
A group whose rows are one contiguous range is sliced, not gathered. Rows stay in the order the
attention plan wants (engine/worker/input_batch.py); the groups index into it. Base rows cost
nothing, and a step without adapter rows has no LoraBatch at all (the model gets lora=None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.device_weights import GpuLoraStep, LoraSlots, plan_gpu_step

Rows = slice | torch.Tensor


@dataclass(frozen=True)
class LoraGroup:
    rows: Rows
    """This adapter's rows of the step: a slice when contiguous, else (n,) int64 row indices."""
    adapter: LoraAdapter


@dataclass(frozen=True)
class LoraBatch:
    groups: tuple[LoraGroup, ...]
    gpu: GpuLoraStep | None = None
    """A CUDA step's groups for the Triton kernels (device_weights.py); None on the CPU."""

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> None:
        """out (T, N) += each group's LoRA term of `projection` in `layer`, computed from x (T, K), in place."""
        if self.gpu is not None:
            self.gpu.add(out, x, layer, projection)
            return
        for group in self.groups:
            lora = group.adapter.layers[layer].get(projection)
            if lora is None:
                continue
            xs = x[group.rows]  # (n, K)
            shrunk = F.linear(xs, lora.a)  # (n, r_total)
            for s in lora.slices:
                out[group.rows, s.start : s.end] += F.linear(shrunk[:, s.r0 : s.r1], s.b)  # (n, end - start)


def build_lora_batch(row_counts: Sequence[int], lora_ids: Sequence[int], adapters: Mapping[int, LoraAdapter],
                     device: torch.device, slots: LoraSlots | None = None) -> LoraBatch | None:
    """`row_counts[i]` rows of chunk i (in step order) run under adapter `lora_ids[i]` (0: the base model).
    None when no row has an adapter: the step pays nothing. On CUDA the batch also carries the kernels'
    layout, its weights from `slots` (the caller's cache of the last stacked set)."""
    if not any(lora_ids):
        return None
    rows: dict[int, list[int]] = {}
    start = 0
    for n, lora_id in zip(row_counts, lora_ids, strict=True):
        if lora_id:
            rows.setdefault(lora_id, []).extend(range(start, start + n))
        start += n
    groups = []
    for lora_id, indices in rows.items():
        contiguous = indices[-1] - indices[0] + 1 == len(indices)
        picked: Rows = (slice(indices[0], indices[-1] + 1) if contiguous
                        else torch.tensor(indices, dtype=torch.int64, device=device))
        groups.append(LoraGroup(picked, adapters[lora_id]))
    gpu = plan_gpu_step(rows, adapters, slots or LoraSlots(), device) if device.type == "cuda" else None
    return LoraBatch(tuple(groups), gpu)
