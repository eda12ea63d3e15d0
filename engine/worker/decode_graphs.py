"""CUDA graphs for decode-only steps: one recorded forward per bucketed batch size (vLLM's approach).

A small model's decode step on a GPU is bound by the host: per layer, a few
kernel launches and about fifteen small torch ops, each a launch. A CUDA graph
replays the whole recorded forward with one launch. A graph fixes its shapes,
so decode batches are padded up to the next bucket:

    buckets      1, 2, 4, 8, 16, 24, 32, ... (multiples of 8) up to max_num_seqs
    row b < B    the step's own token, position, slot, seq_len, block-table row
    row b >= B   padding: token 0, position 0, slot -1 (no KV write), seq_len 1,
                 whatever block-table row was there (valid block ids; one key read)
    query_start_loc = 0, 1, ..., bucket  (every request has one query token)

Attention in the graph is planned for the longest context the engine allows
(max_seq_len = max_model_len), so its split count fits every step; parts
beyond a request's context are empty and the merge ignores them. Only the
body (embedding through the last layer) is recorded; logits and sampling run
eagerly on the real rows. `pick_bucket` and `StaticDecodeInputs.fill` are pure
tensor code, tested on the CPU; the capture needs CUDA and is checked by
ops/gpu_check.py (graph and eager give identical tokens). This module knows
nothing about scheduling or sampling.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from engine.worker.input_batch import StepInputs
from engine.worker.layers.attention import AttentionMetadata, PagedAttentionOp
from engine.worker.models.decoder import DecoderModel


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then multiples of 8, up to and including the first bucket that holds max_num_seqs."""
    sizes = [1, 2, 4] + list(range(8, max_num_seqs + 8, 8))
    return [s for s in sizes if s < max_num_seqs] + [next(s for s in sizes if s >= max_num_seqs)]


def pick_bucket(batch: int, sizes: list[int]) -> int | None:
    """The smallest bucket holding `batch` rows, or None (run eagerly)."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


def is_decode_only(inputs: StepInputs) -> bool:
    return inputs.meta.max_query_len == 1


@dataclass
class StaticDecodeInputs:
    """The fixed buffers a graph reads: `bucket` rows, block tables `width` blocks wide."""

    input_ids: torch.Tensor  # (bucket,) int64
    positions: torch.Tensor  # (bucket,) int64
    meta: AttentionMetadata

    @classmethod
    def allocate(cls, bucket: int, width: int, max_seq_len: int, device: torch.device) -> StaticDecodeInputs:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        meta = AttentionMetadata(
            slot_mapping=torch.full((bucket,), -1, dtype=torch.int64, device=device),
            query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(bucket, dtype=torch.int32, device=device),
            block_tables=zeros(bucket, width, dtype=torch.int32),
            max_query_len=1,
            max_seq_len=max_seq_len,
        )
        return cls(zeros(bucket, dtype=torch.int64), zeros(bucket, dtype=torch.int64), meta)

    @property
    def bucket(self) -> int:
        return self.input_ids.shape[0]

    def fill(self, inputs: StepInputs) -> int:
        """Copy a decode-only step into rows [0, B) and pad the rest; returns B."""
        b, w = inputs.input_ids.shape[0], inputs.meta.block_tables.shape[1]
        assert is_decode_only(inputs) and b <= self.bucket and w <= self.meta.block_tables.shape[1]
        self.input_ids[:b].copy_(inputs.input_ids)
        self.input_ids[b:].zero_()
        self.positions[:b].copy_(inputs.positions)
        self.positions[b:].zero_()
        self.meta.slot_mapping[:b].copy_(inputs.meta.slot_mapping)
        self.meta.slot_mapping[b:].fill_(-1)  # padding rows write no KV
        self.meta.seq_lens[:b].copy_(inputs.meta.seq_lens)
        self.meta.seq_lens[b:].fill_(1)  # one key each: a valid read whose result is dropped
        self.meta.block_tables[:b, :w].copy_(inputs.meta.block_tables)
        return b


class DecodeGraphs:
    """Recorded decode forwards, one per bucket; `forward` replays the right one or returns None."""

    def __init__(self, model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 attention: PagedAttentionOp) -> None:
        self._model, self._kv_caches, self._attention = model, kv_caches, attention
        self._graphs: dict[int, tuple[Any, StaticDecodeInputs, torch.Tensor]] = {}
        self.sizes: list[int] = []

    def capture(self, sizes: list[int], max_model_len: int, block_size: int) -> None:
        """Record one graph per bucket size (CUDA only), largest first so smaller ones share its pool."""
        device = self._kv_caches[0][0].device
        assert device.type == "cuda", "CUDA graphs need a CUDA device"
        width = -(-max_model_len // block_size)
        pool = None
        for bucket in sorted(sizes, reverse=True):
            static = StaticDecodeInputs.allocate(bucket, width, max_model_len, device)
            with torch.inference_mode():
                self._run(static)  # warm: allocations and any lazy init happen outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._run(static)
            pool = graph.pool()
            self._graphs[bucket] = (graph, static, hidden)
        self.sizes = sorted(self._graphs)

    def _run(self, static: StaticDecodeInputs) -> torch.Tensor:
        return self._model(static.input_ids, static.positions, self._kv_caches, static.meta, self._attention)

    def forward(self, inputs: StepInputs) -> torch.Tensor | None:
        """The body's hidden states (B, H) by graph replay, or None when no graph covers this step."""
        if not self._graphs or not is_decode_only(inputs):
            return None
        bucket = pick_bucket(inputs.input_ids.shape[0], self.sizes)
        if bucket is None:
            return None
        graph, static, hidden = self._graphs[bucket]
        b = static.fill(inputs)
        graph.replay()
        return hidden[:b]
