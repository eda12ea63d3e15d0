"""The GPU path of LoRA: a step's adapters stacked into weight slots, and its rows, for the Triton kernels.

    slots (per layer and fused projection; slot i = the i-th active adapter by load id):
        a       (S, R, K)    slot i's stacked A in rows 0 .. rank[i]; the rest zero (never read)
        rank    (S,)         0 for an adapter that does not target this projection: its programs return
        b       (S, NB, RB)  slot i's slices' B, one under the other by rows, ranks zero-padded to RB
                             (a power of two >= 16: the expand kernel then reads B in whole vectors)
        slices  (S, C, 5)    (start, end, r0, r1, b_row0) per slice, C >= 3; end == start: unused entry
    rows (per step, shared by every layer): pageserve_kernels/lora_rows.py's row_indices, group_start,
        group_slot, built once on the host from the planner's lists and copied in one transfer

Stacking copies the adapters' weights once per set of active adapters (`LoraSlots` keeps the last
set: a decode run keeps its set for many steps); a new set restacks, device to device. The copy
doubles the active adapters' device memory while the set runs (slots loaded straight from the host
cache would not: not built yet). The layers
still call LoraBatch.add; batch.py hands a CUDA step to `GpuLoraStep.add`, never a CPU one. Knows
nothing about requests; imports no Triton until a CUDA step runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.worker.lora.adapter import LoraAdapter, ProjectionLora


@dataclass(frozen=True)
class ProjectionSlots:
    a: torch.Tensor
    """(S, R, K): every slot's stacked A, zero past its rank."""
    rank: torch.Tensor
    """(S,) int32: rows of a in use per slot (0: the slot's adapter leaves this projection alone)."""
    b: torch.Tensor
    """(S, NB, RB): every slot's slices' B (scale folded in), stacked by rows."""
    slices: torch.Tensor
    """(S, C, 5) int32: (start, end, r0, r1, b_row0) of each slice of each slot."""


@dataclass(frozen=True)
class DeviceLoraWeights:
    adapters: tuple[LoraAdapter, ...]
    """Slot i holds adapters[i] (sorted by load id)."""
    layers: tuple[dict[str, ProjectionSlots], ...]
    """Per decoder layer: projection -> its slots, only where some adapter targets it."""


def stack_projection(loras: Sequence[ProjectionLora | None]) -> ProjectionSlots:
    """One projection's slots, one per entry of `loras` (None: an adapter that does not target it)."""
    some = [p for p in loras if p is not None]
    assert some, "a projection no adapter targets gets no slots"
    like = some[0].a
    num, width = len(loras), like.shape[1]
    rank = max(p.a.shape[0] for p in some)
    # at least 3 entries (q/k/v): the count is a constexpr of the expand, so o, down and gate_up share
    # qkv's binary; an unused entry costs a program five scalar loads
    num_slices = max(3, *(len(p.slices) for p in some))
    b_rows = max(sum(s.end - s.start for s in p.slices) for p in some)
    b_rank = max(16, 1 << (max(s.r1 - s.r0 for p in some for s in p.slices) - 1).bit_length())  # padded_rank
    a = torch.zeros(num, rank, width, dtype=like.dtype, device=like.device)
    b = torch.zeros(num, b_rows, b_rank, dtype=like.dtype, device=like.device)
    table = torch.zeros(num, num_slices, 5, dtype=torch.int32)
    ranks = torch.zeros(num, dtype=torch.int32)
    for i, p in enumerate(loras):
        if p is None:
            continue
        a[i, : p.a.shape[0]] = p.a
        ranks[i] = p.a.shape[0]
        row = 0
        for c, s in enumerate(p.slices):
            b[i, row: row + s.end - s.start, : s.r1 - s.r0] = s.b
            table[i, c] = torch.tensor((s.start, s.end, s.r0, s.r1, row))
            row += s.end - s.start
    return ProjectionSlots(a, ranks.to(like.device), b, table.to(like.device))


def stack_adapters(adapters: Sequence[LoraAdapter]) -> DeviceLoraWeights:
    """Every layer's and projection's slots for these adapters, slot i = adapters[i]."""
    layers = []
    for layer in range(len(adapters[0].layers)):
        per_layer = [adapter.layers[layer] for adapter in adapters]
        names = sorted({name for projections in per_layer for name in projections})
        layers.append({name: stack_projection([p.get(name) for p in per_layer]) for name in names})
    return DeviceLoraWeights(tuple(adapters), tuple(layers))


class LoraSlots:
    """The slots of the last set of active adapters, restacked only when the set changes.

    Holds that set's adapters (and a copy of their weights) until the next set replaces it, so an
    unloaded adapter's memory returns one set change later."""

    def __init__(self) -> None:
        self._last: DeviceLoraWeights | None = None
        self.stacks = 0
        """How many times a set was stacked (tests read it)."""

    def get(self, adapters: Sequence[LoraAdapter]) -> DeviceLoraWeights:
        """`adapters` must be sorted by load id (slot order)."""
        last = self._last
        if last is None or len(last.adapters) != len(adapters) or \
                any(x is not y for x, y in zip(last.adapters, adapters, strict=True)):
            last = self._last = stack_adapters(adapters)
            self.stacks += 1
        return last


@dataclass(frozen=True)
class GpuLoraStep:
    """One step's adapter rows and slots, as the kernels read them."""

    weights: DeviceLoraWeights
    row_indices: torch.Tensor
    """(M,) int32: the adapter rows of the step, group after group."""
    group_start: torch.Tensor
    """(G + 1,) int32: group g owns row_indices[group_start[g]:group_start[g + 1]]."""
    group_slot: torch.Tensor
    """(G,) int32: the slot group g reads."""
    max_rows: int
    """The largest group's row count (sizes the launch without reading the device)."""

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> None:
        """out (T, N) += the LoRA term of `projection` in `layer` for every group, from x (T, K): two launches."""
        from pageserve_kernels.lora_expand import lora_expand
        from pageserve_kernels.lora_shrink import lora_shrink

        slots = self.weights.layers[layer].get(projection)
        if slots is None:
            return
        rows = (self.row_indices, self.group_start, self.group_slot)
        s = lora_shrink(x, slots.a, slots.rank, *rows, self.max_rows)  # (M, R) float32
        lora_expand(s, slots.b, slots.slices, out, *rows, self.max_rows)


def plan_gpu_step(rows: Mapping[int, Sequence[int]], adapters: Mapping[int, LoraAdapter], slots: LoraSlots,
                  device: torch.device) -> GpuLoraStep:
    """`rows[lora_id]` are that adapter's rows of the step (step order); one group per adapter."""
    ids = sorted(rows)
    weights = slots.get([adapters[i] for i in ids])
    counts = [len(rows[i]) for i in ids]
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    parts = ([r for i in ids for r in rows[i]], starts, list(range(len(ids))))
    # one transfer for the three; each starts 16 bytes in (Triton specialises on pointer alignment)
    offsets = [0, _align4(len(parts[0])), _align4(len(parts[0])) + _align4(len(parts[1]))]
    host = torch.zeros(offsets[2] + len(parts[2]), dtype=torch.int32)
    for offset, values in zip(offsets, parts, strict=True):
        host[offset: offset + len(values)] = torch.tensor(values, dtype=torch.int32)
    packed = host.to(device)
    views = [packed[offset: offset + len(values)] for offset, values in zip(offsets, parts, strict=True)]
    return GpuLoraStep(weights, *views, max(counts))


def _align4(n: int) -> int:
    return -(-n // 4) * 4
