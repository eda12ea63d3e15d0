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
from shared.sampling import SamplingParams

ChunkTuple = tuple[str, list[int], int, list[int], bool]

_UNUSED_SAMPLING = SamplingParams()


@dataclass(frozen=True)
class StepMessage:
    chunks: list[ChunkTuple]
    """(request id, token ids, start position, block ids, sample) in scheduler order."""
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    copy: list[tuple[int, int]]

    @classmethod
    def of(cls, out: SchedulerOutput) -> StepMessage:
        chunks = [(c.request_id, c.token_ids, c.start_position, c.block_ids, c.sample) for c in out.chunks]
        return cls(chunks, out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy)

    def scheduler_output(self) -> SchedulerOutput:
        chunks = [ScheduledChunk(rid, ids, start, blocks, sample, _UNUSED_SAMPLING, 0)
                  for rid, ids, start, blocks, sample in self.chunks]
        return SchedulerOutput(chunks, self.swap_out, self.swap_in, self.copy)
