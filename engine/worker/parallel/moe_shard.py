"""One tensor-parallel rank's slice of a SparseMoE: every expert split along its intermediate dimension.

    router_weight        (E, H)        replicated: every rank routes every token the same way
    experts_gate_up[e]   (2I, H)  rows [gate | up] -> [gate, up of this rank's columns]   (column-parallel)
    experts_down[e]      (H, I)   the same intermediate columns                           (row-parallel)
    shared_gate_up/down  the shared expert's intermediate split the same way
    shared_expert_gate   (1, H)        replicated: the sigmoid scales each rank's partial sum alike

Each rank's forward is then a partial (T, H) sum, and the all_reduce after it is the dense MLP's
(engine/worker/parallel/layers.py, RowParallelOutput): vLLM's tensor-parallel MoE, no expert
parallelism, no token exchange. Columns split as partition.even_split does (lower ranks take the
extra one). Copies (`.clone()`), like sharding.py. Knows nothing about processes or collectives.
"""

from __future__ import annotations

import torch

from engine.worker.layers.moe import SparseMoE
from engine.worker.parallel.partition import even_split


def _columns(full: torch.Tensor, size: int, cols: tuple[int, int]) -> torch.Tensor:
    """[gate | up] rows (last two dims (2I, H)) -> the gate and up rows of `cols`."""
    gate, up = full[..., cols[0]: cols[1], :], full[..., size + cols[0]: size + cols[1], :]
    return torch.cat([gate, up], dim=-2).contiguous()


def shard_moe(full: SparseMoE, world_size: int, rank: int) -> SparseMoE:
    """Rank `rank`'s SparseMoE of `world_size`: sum over ranks of their outputs == full(x) (up to rounding)."""
    dtype = full.router_weight.dtype
    cols = even_split(full.intermediate_size, world_size, rank)
    shared_cols = None if full.shared_intermediate_size is None else even_split(
        full.shared_intermediate_size, world_size, rank)
    mine = SparseMoE(
        full.hidden_size, cols[1] - cols[0], full.num_experts, full.top_k, full.norm_topk_prob, dtype,
        None if shared_cols is None else shared_cols[1] - shared_cols[0],
        round_routing_weights=full.round_routing_weights,
    )
    with torch.no_grad():
        mine.router_weight.data = full.router_weight.data.clone()
        mine.experts_gate_up.data = _columns(full.experts_gate_up.data, full.intermediate_size, cols)  # (E, 2i, H)
        mine.experts_down.data = full.experts_down.data[:, :, cols[0]: cols[1]].contiguous()  # (E, H, i)
        if shared_cols is not None:
            assert full.shared_intermediate_size is not None
            mine.shared_gate_up.data = _columns(full.shared_gate_up.data, full.shared_intermediate_size, shared_cols)
            mine.shared_down.data = full.shared_down.data[:, shared_cols[0]: shared_cols[1]].contiguous()
            mine.shared_expert_gate.data = full.shared_expert_gate.data.clone()
    return mine
