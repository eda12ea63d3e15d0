"""The step being assembled: chunks under a token budget and the block moves they need.

`Scheduler.schedule()` fills one `StepBuilder` and turns it into the `SchedulerOutput`
the runner executes. It builds the chunks and keeps the budget; it decides nothing
about who runs (engine/scheduling/scheduler.py does) and holds no blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.request import Request
from engine.scheduling.block_manager import BlockPairs
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.sample_group import SampleState
from engine.scheduling.slo import SloPlanner
from engine.scheduling.step_cost import BACKLOG_AGE_S, StepCosts

WAVE_STEPS = 4
"""A prompt waits at most this many decode steps for streams that all end by then (wave_ends_soon). 8 closed-loop
streams of equal length end together and their clients send the next prompts together; one stream a step ahead
sent its prompt alone while the other seven decoded their last tokens, and that prompt's step stalled all seven
once a round: p99 ITL 144 ms against a 15 ms median (9.4x; Zen 4, bfloat16, whole-prompt steps)."""


@dataclass
class StepBuilder:
    budget: int
    """Tokens this step may still compute."""
    prefill_budget: int | None = None
    """Prompt tokens this step may still compute (None: only `budget` limits them); the serving
    mode's bound on how long a prompt step stalls the streams that are generating."""
    chunk_cap: int = 0
    """Most tokens of one request per step (long_prefill_token_threshold; 0: no cap)."""
    chunks: list[ScheduledChunk] = field(default_factory=list)
    swap_out: BlockPairs = field(default_factory=list)
    swap_in: BlockPairs = field(default_factory=list)
    copies: BlockPairs = field(default_factory=list)

    def room(self, req: Request, wanted: int, num_cached: int = 0) -> int:
        """How many of `wanted` next tokens of `req` (after `num_cached` prefix-cache hits) fit this
        step (0: none). Prompt tokens count against the prefill budget as well as `budget`."""
        num_new = min(wanted, self.budget, self.chunk_cap or wanted)
        prompt_left = req.num_prompt_tokens - req.num_computed_tokens - num_cached
        if self.prefill_budget is not None and prompt_left > 0:
            num_new = min(num_new, self.prefill_budget)
        return max(num_new, 0)

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
                prompt_token_ids=req.prompt_token_ids,
                output_token_ids=req.output_token_ids,
                grammar=req.grammar,
                lora_id=req.lora_id,
            )
        )
        self.copies += copies
        self.budget -= num_new
        if self.prefill_budget is not None and start < n_prompt:
            self.prefill_budget -= min(num_new, n_prompt - start)

    def build(self, finished_request_ids: list[str]) -> SchedulerOutput:
        return SchedulerOutput(
            chunks=self.chunks,
            blocks_to_swap_out=self.swap_out,
            blocks_to_swap_in=self.swap_in,
            blocks_to_copy=self.copies,
            finished_request_ids=finished_request_ids,
        )


def serving_prefill_budget(config: SchedulerConfig, running: list[Request], waiting: Iterable[Request],
                           costs: StepCosts, now: float, live: Mapping[str, SampleState],
                           slo: SloPlanner | None = None) -> int | None:
    """The serving mode's prompt-token bound for a step: set while any running stream generates; in
    time (prefill_stall_factor, from the measured step costs) under the token cap, lifted while prompt
    tokens wait (queued, or part-prefilled), so that a backlog drains within costs.backlog_drain_s, and
    while prompts arrive faster than the cap admits them (either past the cap, up to the step's token budget
    and a step about SATURATED_STALL x a decode step: a saturated server admits more than a cap's worth a
    step, StepCosts.prompt_budget); then lifted again as far as the prompts' TTFT deadlines need, within the
    ITL bounds (`slo`, engine/scheduling/slo.py: the serving targets are decided there).
    Only prompts that have waited BACKLOG_AGE_S by `now` (`live`: when each was queued) count toward the
    backlog: a queue that outlives that is a saturated server's, a younger burst is the deadlines'."""
    cap = config.max_prefill_tokens_while_decoding
    generating = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens]
    if not cap or not generating:
        return None
    if wave_ends_soon(generating):
        return 0  # every generating stream ends within WAVE_STEPS steps: the prompts start as they go
    if costs.stale(len(generating)):
        return 0  # this step measures what a decode step of the grown (or shrunk) batch takes
    prefilling = [r for r in running if r.num_computed_tokens < r.num_prompt_tokens]
    backlog = _backlog(waiting, prefilling, now, live) if costs.backlog_drain_s > 0 else 0
    budget = costs.prompt_budget(cap, backlog, max(cap, config.max_num_batched_tokens))
    if slo is None or not (slo.ttft_target_s or slo.itl_target_s):
        return budget
    due = [(live[r.request_id].enqueued_at + slo.ttft_target_s, r.num_tokens - r.num_computed_tokens)
           for group in (waiting, prefilling) for r in group
           if r.num_output_tokens == 0 and r.request_id in live]  # a resumed request had its first token
    return slo.prompt_tokens(costs, due, now, budget, config.max_num_batched_tokens)


def wave_ends_soon(generating: list[Request]) -> bool:
    """Whether every generating stream reaches its max_tokens within WAVE_STEPS steps (an EOS only ends it
    sooner). A prompt step now would stall streams that are about to end; a few decode steps later it stalls
    none, and the prompts whose clients were waiting on those streams (a closed loop) join it."""
    return bool(generating) and all(r.sampling.max_tokens - r.num_output_tokens <= WAVE_STEPS for r in generating)


def _backlog(waiting: Iterable[Request], prefilling: list[Request], now: float,
             live: Mapping[str, SampleState]) -> int:
    """Prompt tokens left of the prompts queued BACKLOG_AGE_S or longer (counted only when the floor is on)."""
    def old(r: Request) -> bool:
        state = live.get(r.request_id)  # always there; unknown would count as old
        return state is None or now - state.enqueued_at >= BACKLOG_AGE_S

    return (sum(r.num_tokens - r.num_computed_tokens for r in waiting if old(r))
            + sum(r.num_prompt_tokens - r.num_computed_tokens for r in prefilling if old(r)))
