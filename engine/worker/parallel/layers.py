"""The tensor-parallel Llama: our DecoderModel over one rank's shard, with the collectives Megatron-LM places.

    embed_tokens   vocabulary-parallel: each rank looks up the ids in its vocabulary slice
                   (others read row 0 and are zeroed), then all_reduce (T, H)
    attention      column-parallel QKV (this rank's query and KV heads only, its own KV pool),
                   row-parallel o_proj: a partial (T, H) product, all_reduce
    MLP            column-parallel gate/up, row-parallel down: partial (T, H), all_reduce
    compute_logits this rank's (N, V / n) slice of the LM head, gathered on rank 0: (N, V) there,
                   None on the other ranks (only rank 0 samples)

The layer code itself is unchanged: a DecoderLayer built from the rank's narrower ModelSpec
(fewer heads, a narrower MLP, a vocabulary slice) computes exactly its share, and the
collectives (engine/worker/parallel/group.py) wrap its outputs.
This module knows nothing about processes, scheduling or how the weights were sliced.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.models.decoder import DecoderModel
from engine.worker.models.spec import ModelSpec
from engine.worker.parallel.group import RankGroup
from engine.worker.parallel.partition import ShardPlan


class RowParallelOutput(nn.Module):
    """Wraps a module whose output is a partial sum (row-parallel o_proj / down_proj) and reduces it."""

    def __init__(self, inner: nn.Module, group: RankGroup) -> None:
        super().__init__()
        self.inner, self.group = inner, group

    def projection_weights(self) -> list[torch.Tensor]:
        return self.inner.projection_weights()  # type: ignore[operator,no-any-return]

    def pack_weights(self, one_copy: bool = False) -> None:
        self.inner.pack_weights(one_copy)  # type: ignore[operator]

    def forward(self, *args: Any) -> torch.Tensor:
        return self.group.all_reduce(self.inner(*args))


class ParallelLlama(DecoderModel):
    def __init__(
        self, local_shape: ModelSpec, dtype: torch.dtype, max_position: int, plan: ShardPlan, group: RankGroup
    ) -> None:
        """`local_shape`: this rank's widths (heads, intermediate, vocabulary slice) of the full model."""
        super().__init__(local_shape, dtype, max_position)
        self.plan, self.group = plan, group
        for layer in self.layers:
            layer.attn = RowParallelOutput(layer.attn, group)
            layer.mlp = RowParallelOutput(layer.mlp, group)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, H)
        start, stop = self.plan.vocab
        mine = (input_ids >= start) & (input_ids < stop)
        local = torch.where(mine, input_ids - start, 0)
        h = F.embedding(local, self.embed) * mine.unsqueeze(1).to(self.embed.dtype)
        return self.group.all_reduce(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, H) -> (N, V) on rank 0, else None
        local = super().compute_logits(hidden)  # (N, this rank's vocabulary slice) float32
        pad = self.plan.vocab_slice - local.shape[1]
        if pad:
            local = F.pad(local, (0, pad), value=float("-inf"))
        parts = self.group.gather(local)
        if parts is None:
            return None  # type: ignore[return-value]
        return torch.cat(parts, dim=1)[:, : self.plan.vocab_total]
