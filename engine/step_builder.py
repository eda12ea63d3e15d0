"""The step being assembled: chunks under a token budget and the block moves they need.

`Scheduler.schedule()` fills one `StepBuilder` and turns it into the `SchedulerOutput`
the runner executes. It builds the chunks and keeps the budget; it decides nothing
about who runs (engine/scheduler.py does) and holds no blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.block_manager import BlockPairs
from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.request import Request


@dataclass
class StepBuilder:
    budget: int
    """Tokens this step may still compute."""
    chunks: list[ScheduledChunk] = field(default_factory=list)
    swap_out: BlockPairs = field(default_factory=list)
    swap_in: BlockPairs = field(default_factory=list)
    copies: BlockPairs = field(default_factory=list)

    def add_chunk(self, req: Request, num_new: int, copies: BlockPairs) -> None:
        """Compute the request's next `num_new` tokens this step (its blocks already cover
        them); advances `num_computed_tokens`, as the chunk's KV is written by this step."""
        start, n_prompt = req.num_computed_tokens, req.num_prompt_tokens
        if start >= n_prompt:  # a decode or a resumed generation: no prompt copy
            tokens = req.output_token_ids[start - n_prompt : start - n_prompt + num_new]
        else:
            tokens = req.all_token_ids[start : start + num_new]
        req.num_computed_tokens += num_new
        self.chunks.append(
            ScheduledChunk(
                request_id=req.request_id,
                token_ids=tokens,
                start_position=start,
                block_ids=req.block_ids,  # the block manager replaces, never mutates, this list
                sample=req.num_computed_tokens == req.num_tokens,
                sampling=req.sampling,
                num_output_tokens=req.num_output_tokens,
                eos_token_id=req.eos_token_id,
                grammar=req.grammar,
            )
        )
        self.copies += copies
        self.budget -= num_new

    def build(self, finished_request_ids: list[str]) -> SchedulerOutput:
        return SchedulerOutput(
            chunks=self.chunks,
            blocks_to_swap_out=self.swap_out,
            blocks_to_swap_in=self.swap_in,
            blocks_to_copy=self.copies,
            finished_request_ids=finished_request_ids,
        )
