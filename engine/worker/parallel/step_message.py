"""What rank 0 sends the other ranks each step: the runner's step description, without what only rank 0 reads.

    SchedulerOutput ─> StepMessage: per chunk (request id, token ids, start position, block table, samples?)
                                    + the block moves (swap out, swap in, copy-on-write)
    StepMessage ─> SchedulerOutput on a worker (sampling fields left at their defaults: only rank 0 samples)

Every rank builds the same flat inputs from it (engine/worker/input_batch.py is deterministic in
the chunk order) and applies the same block moves to its own KV heads in the same step. Sampling
parameters, grammars and the prompts' full token lists stay on rank 0: they are not pickled.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.worker.input_batch import prompt_rows_of
from shared.sampling import SamplingParams

ChunkTuple = tuple[str, list[int], int, list[int], bool, int]

_UNUSED_SAMPLING = SamplingParams()
_PROMPT_ROWS_SAMPLING = SamplingParams(prompt_logprobs=0)


@dataclass(frozen=True)
class StepMessage:
    chunks: list[ChunkTuple]
    """(request id, token ids, start position, block ids, sample, prompt rows) in scheduler order; prompt
    rows: how many of the chunk's rows rank 0 sends through lm_head for prompt logprobs (a collective)."""
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    copy: list[tuple[int, int]]

    @classmethod
    def of(cls, out: SchedulerOutput) -> StepMessage:
        chunks = [(c.request_id, c.token_ids, c.start_position, c.block_ids, c.sample, prompt_rows_of(c))
                  for c in out.chunks]
        return cls(chunks, out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy)

    def scheduler_output(self) -> SchedulerOutput:
        chunks = [ScheduledChunk(rid, ids, start, blocks, sample, _UNUSED_SAMPLING, 0) if not rows else
                  # A stand-in prompt whose length gives input_batch the same prompt rows (its ids are never read).
                  ScheduledChunk(rid, ids, start, blocks, sample, _PROMPT_ROWS_SAMPLING, 0, None, [0] * (start + 1 + rows))
                  for rid, ids, start, blocks, sample, rows in self.chunks]
        return SchedulerOutput(chunks, self.swap_out, self.swap_in, self.copy)
