"""One scheduler step as flat tensors: what the model and attention read.

    chunks (scheduler order)   ->  rows: [ decodes, longest context first | prefill chunks ]
    token_ids   (T,)   the chunks' tokens, concatenated
    positions   (T,)   start_position .. start_position + len - 1 per chunk
    slot_mapping (T,)  block_ids[p // block_size] * block_size + p % block_size
    seq_lens    (B,)   start_position + len: tokens in the cache after the write
    logits_indices (N + P,) the last row of every chunk that samples (only these reach lm_head), then
                   the P prompt rows of requests that asked for prompt_logprobs (row p predicts token p+1)

Decodes go first, sorted by context length, so that the CPU attention plan's
decode groups are contiguous row ranges. Everything is computed from host-side
Python lists; no tensor is read back. Knows nothing about the model's weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.outputs import ScheduledChunk
from engine.worker.layers.attention import AttentionMetadata, PagedAttentionOp
from pageserve_kernels.cpu_attention_plan import compute_slot_mapping


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor
    """(T,) int64"""
    positions: torch.Tensor
    """(T,) int64"""
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    """(N,) int64 rows whose hidden state is turned into logits."""
    sampled: list[ScheduledChunk]
    """The N chunks that sample, in logits_indices order."""
    prompt_rows: list[PromptRows] = field(default_factory=list)
    """After the N sampled rows, in logits_indices order: rows whose logits give prompt logprobs."""

    @property
    def has_logits(self) -> bool:
        """Whether lm_head runs this step (every tensor-parallel rank must agree: it is a collective)."""
        return bool(self.sampled or self.prompt_rows)


@dataclass(frozen=True)
class PromptRows:
    """A chunk's rows that predict prompt tokens: logits rows for prompt positions first .. first + count - 1."""

    chunk: ScheduledChunk
    first: int
    """The first predicted prompt position (>= 1: nothing predicts token 0)."""
    count: int


def prompt_rows_of(c: ScheduledChunk) -> int:
    """How many of the chunk's rows predict a prompt token (its row j predicts position start + j + 1)."""
    if c.sampling.prompt_logprobs is None:
        return 0
    return max(0, min(len(c.token_ids), len(c.prompt_token_ids) - 1 - c.start_position))


def order_chunks(chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
    """Decodes first (longest context first), then multi-token chunks in scheduler order."""
    decodes = [c for c in chunks if len(c.token_ids) == 1]
    decodes.sort(key=lambda c: -c.start_position)
    return decodes + [c for c in chunks if len(c.token_ids) != 1]


def build_step_inputs(
    chunks: list[ScheduledChunk], block_size: int, device: torch.device, attention: PagedAttentionOp
) -> StepInputs:
    """`chunks` must already be in `order_chunks` order; the attention op adds its own plan."""
    token_ids: list[int] = []
    positions: list[int] = []
    query_lens, seq_lens, tables, starts, logits_rows = [], [], [], [0], []
    sampled: list[ScheduledChunk] = []
    prompt_rows: list[PromptRows] = []
    prompt_row_ids: list[int] = []
    for c in chunks:
        n = len(c.token_ids)
        if n == 0:
            raise ValueError(f"request {c.request_id}: empty chunk")
        token_ids.extend(c.token_ids)
        positions.extend(range(c.start_position, c.start_position + n))
        query_lens.append(n)
        seq_lens.append(c.start_position + n)
        tables.append(c.block_ids)
        starts.append(starts[-1] + n)
        if c.sample:
            logits_rows.append(starts[-1] - 1)
            sampled.append(c)
        wanted = prompt_rows_of(c)
        if wanted:
            prompt_rows.append(PromptRows(c, c.start_position + 1, wanted))
            prompt_row_ids.extend(range(starts[-2], starts[-2] + wanted))
    max_blocks = max(len(t) for t in tables)
    attention_plan = attention.plan(query_lens, seq_lens, tables, block_size, device)
    if attention_plan is not None:
        slot_mapping = attention_plan.slot_mapping
    else:
        slot_mapping = torch.tensor(compute_slot_mapping(query_lens, seq_lens, tables, block_size), device=device)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        plan=attention_plan,
    )
    return StepInputs(
        input_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta,
        logits_indices=torch.tensor(logits_rows + prompt_row_ids, dtype=torch.int64, device=device),
        sampled=sampled,
        prompt_rows=prompt_rows,
    )
