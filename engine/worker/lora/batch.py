"""One step's rows grouped by adapter, and the LoRA term each projection adds for them.

    rows (step order):  [ d0 d1 d2 d3 | p0 p0 p0 p1 p1 ]      adapter per row: [ a 0 b a | b b b 0 0 ]
    groups:             a -> rows {0, 3}   b -> rows {2, 4, 5, 6}       (base rows: in no group)

Per group and projection (Punica's shrink/expand split, in PyTorch: the reference for any kernel):
    s = x[rows] A_stack^T                (n, r_total)    one shrink product per group
    out[rows, slice] += s[:, r cols] B^T (n, slice)      one expand product per targeted slice
A group whose rows are one contiguous range is sliced, not gathered. Rows stay in the order the
attention plan wants (engine/worker/input_batch.py); the groups index into it. Base rows cost
nothing, and a step without adapter rows has no LoraBatch at all (the model gets lora=None).

Where every adapter of the step has its kernel table (the CPU kernels loaded: pageserve_kernels/cpu_lora.py),
the batch also carries the step's entry table, (groups, layers, projections, ENTRY) int64: the adapters'
tables stacked, each group's row range into `rows` (every group's rows, group after group) written in.
Then `add` is one kernel call per projection for all groups, the very call the C++ layer loop makes
(engine/worker/native_layers.py), and the PyTorch products below are the reference it is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.device_weights import GpuLoraStep, LoraSlots, plan_gpu_step
from pageserve_kernels import cpu_lora

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
    kernel: cpu_lora.NativeLora | None = None
    """The C kernel `add` calls on the CPU (with `rows` and `table`), or None: PyTorch's products."""
    rows: torch.Tensor | None = None
    """(n,) int64: every group's rows of the step, group after group (the kernel's row lists)."""
    table: torch.Tensor | None = None
    """(groups, layers, projections, ENTRY) int64: the kernel's entries for this step."""

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> None:
        """out (T, N) += each group's LoRA term of `projection` in `layer`, computed from x (T, K), in place."""
        if self.gpu is not None:
            self.gpu.add(out, x, layer, projection)
        elif self.kernel is not None:
            assert self.rows is not None and self.table is not None
            self.kernel.add(out, x, self.rows, self.table, layer, cpu_lora.PROJECTIONS.index(projection))
        else:
            self.reference(out, x, layer, projection)

    def reference(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> None:
        """`add` by PyTorch's products: the definition, and the path where no kernel runs."""
        for group in self.groups:
            lora = group.adapter.layers[layer].get(projection)
            if lora is None:
                continue
            assert lora.a is not None, "an adapter laid out for the C kernel only (adapter.py packed=False: plain)"
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
    if device.type == "cuda":
        return LoraBatch(tuple(groups), gpu=plan_gpu_step(rows, adapters, slots or LoraSlots(), device))
    return _with_kernel(tuple(groups), list(rows.values()))


def _with_kernel(groups: tuple[LoraGroup, ...], rows: list[list[int]]) -> LoraBatch:
    """The batch with the step's kernel table where every adapter has its table (else PyTorch's products)."""
    tables = [g.adapter.table for g in groups]
    kernel = cpu_lora.load(groups[0].adapter.dtype) if all(t is not None for t in tables) else None
    if kernel is None:
        return LoraBatch(groups)
    table = torch.stack(tables)  # type: ignore[arg-type]  # (G, L, projections, ENTRY)
    lengths = torch.tensor([len(r) for r in rows])
    ends = lengths.cumsum(0)
    table[..., 0] = (ends - lengths).view(-1, 1, 1)  # group g's rows: flat[begin:end]
    table[..., 1] = ends.view(-1, 1, 1)
    flat = torch.tensor([i for r in rows for i in r], dtype=torch.int64)
    return LoraBatch(groups, kernel=kernel, rows=flat, table=table)
