"""Every Triton LoRA kernel variant a CUDA step can launch, compiled before serving (issue 43).

Triton compiles a binary per set of constexprs (and per int argument's divisibility by 16), so
the first step with a new one stalls for seconds. What picks them (pageserve_kernels/lora_shrink.py,
lora_expand.py, device_weights.py's slot layout; this file calls their own functions for each):

    shrink   BLOCK_M   the largest group's rows (16, 32, 64)       launch_block_m(max_rows)
             SPLIT_K   groups x row blocks and the input width K  shrink_split_k(max_rows, groups, K)
             BLOCK_R   the slots' largest stacked rank R (16..64) R = sum of a projection's targets' ranks
    expand   BLOCK_M   as above;  BLOCK_R = RB, the padded rank of the largest slice (16, 32, 64, ...)
             NUM_SLICES = 3 always (device_weights pads slice tables to q/k/v's three), B_PADDED always
    both     the model dtype; strides and widths are multiples of 16 (model widths, padded ranks)

So the set is found by walking the row shapes a step can have (the largest group's rows up to the
step's token budget, groups up to --max-loras) and the adapter shapes (ranks up to --max-lora-rank,
1 to 3 targets per projection), keeping one launch per new variant; each is then run once through
the serving path itself (stack_projection, plan_gpu_step, GpuLoraStep.add) on synthetic adapters.
Assumes the model's projection widths are multiples of 16 (every model the GPU path serves); a
width that is not may meet one more binary on its first step. Knows nothing about requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.lora.adapter import LoraAdapter, LoraSlice, ProjectionLora
from engine.worker.lora.device_weights import LoraSlots, plan_gpu_step
from engine.worker.models.spec import ModelSpec
from pageserve_kernels.lora_expand import padded_rank
from pageserve_kernels.lora_rows import launch_block_m
from pageserve_kernels.lora_shrink import BLOCK_K, shrink_block_r, shrink_split_k


@dataclass(frozen=True)
class LoraWarmup:
    """One warm-up launch: `groups` adapters (one target set, `rank` each) on `projection`, the first group
    `max_rows` rows and the others one row each."""

    projection: str
    max_rows: int
    groups: int
    rank: int
    targets: int

    def describe(self) -> str:
        return (f"lora {self.projection}: {self.groups} group(s), largest {self.max_rows} rows, "
                f"{self.targets} target(s) of rank {self.rank}")


def row_shapes(k: int, max_rows: int, max_groups: int) -> list[tuple[int, int]]:
    """(largest group's rows, groups): the first reaching each (BLOCK_M, SPLIT_K) a K-wide shrink can get.
    A step's rows (groups - 1 of them at least one each) fit its token budget `max_rows`."""
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for groups in range(1, max_groups + 1):
        # the launch sees rows only through BLOCK_M (16, 32, 64: rows 1, 17, 33 start each) and the row
        # blocks of 64 (65, 129, ... start each): the first of each band gives every key, in O(budget / 64)
        for rows in (r for r in (1, 17, 33, *range(65, max_rows + 1, 64)) if r <= max_rows - groups + 1):
            seen.setdefault((launch_block_m(rows), shrink_split_k(rows, groups, k, BLOCK_K)), (rows, groups))
    return sorted(seen.values())


def adapter_shapes(max_rank: int, num_targets: int) -> list[tuple[int, int]]:
    """(rank, targets): the first reaching each (shrink BLOCK_R, expand RB) pair for a projection of
    `num_targets` separate targets (their ranks stack in the shrink)."""
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for rank in range(1, max_rank + 1):
        for targets in range(1, num_targets + 1):
            key = (shrink_block_r(rank * targets), padded_rank(rank))
            seen.setdefault(key, (rank, targets))
    return sorted(seen.values())


def projection_widths(spec: ModelSpec) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Fused projection -> (input width K, its separate targets' output widths)."""
    h, q, kv, inter = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    return {"qkv": (h, (q, kv, kv)), "o": (q, (h,)), "gate_up": (h, (inter, inter)), "down": (inter, (h,))}


def lora_warmup_plan(spec: ModelSpec, max_lora_rank: int, max_loras: int, max_num_batched_tokens: int,
                     max_num_seqs: int) -> list[LoraWarmup]:
    """The launches that compile every LoRA kernel variant a step of this engine can request."""
    plan = []
    max_groups = min(max_loras, max_num_seqs, max_num_batched_tokens)
    for projection, (k, widths) in projection_widths(spec).items():
        for rows, groups in row_shapes(k, max_num_batched_tokens, max_groups):
            for rank, targets in adapter_shapes(max_lora_rank, len(widths)):
                plan.append(LoraWarmup(projection, rows, groups, rank, targets))
    return plan


def _adapter(spec: ModelSpec, w: LoraWarmup, load_id: int, dtype: torch.dtype, device: torch.device) -> LoraAdapter:
    k, widths = projection_widths(spec)[w.projection]
    slices, start = [], 0
    for i, width in enumerate(widths):
        if i < w.targets:
            b = torch.zeros(width, w.rank, dtype=dtype, device=device)
            slices.append(LoraSlice(start, start + width, i * w.rank, (i + 1) * w.rank, b))
        start += width
    a = torch.zeros(w.targets * w.rank, k, dtype=dtype, device=device)
    return LoraAdapter(f"warmup-{load_id}", "", load_id, w.rank, ({w.projection: ProjectionLora(a, tuple(slices))},))


def run_lora_warmup(spec: ModelSpec, plan: list[LoraWarmup], dtype: torch.dtype, device: torch.device) -> None:
    """Launch each planned shape once through the serving path (zero weights: the output is untouched)."""
    for w in plan:
        k, widths = projection_widths(spec)[w.projection]
        adapters = {i: _adapter(spec, w, i, dtype, device) for i in range(1, w.groups + 1)}
        rows = {1: list(range(w.max_rows))}
        rows.update({i: [w.max_rows + i - 2] for i in range(2, w.groups + 1)})
        total = w.max_rows + w.groups - 1
        step = plan_gpu_step(rows, adapters, LoraSlots(), device)
        x = torch.zeros(total, k, dtype=dtype, device=device)  # (T, K)
        out = torch.zeros(total, sum(widths), dtype=dtype, device=device)  # (T, N)
        step.add(out, x, 0, w.projection)
