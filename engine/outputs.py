"""The plain data that flows through one engine step.

    scheduler.schedule() -> SchedulerOutput     what to compute, which blocks to move
    runner.execute(SchedulerOutput) -> RunnerOutput   one sampled token per finished chunk
    scheduler.update(SchedulerOutput, RunnerOutput) -> list[RequestDelta]

These cross no process boundary; the wire protocol (shared/protocol.py) carries
RequestDelta's fields to the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.protocol import TokenLogprob
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec


@dataclass(frozen=True)
class ScheduledChunk:
    """A run of consecutive tokens of one request to push through the model this step."""

    request_id: str
    token_ids: list[int]
    """The tokens to compute: all_token_ids[start_position : start_position + len]."""
    start_position: int
    """Position of token_ids[0]; earlier positions are already in the KV cache."""
    block_ids: list[int]
    """The request's block table, covering start_position + len(token_ids) tokens."""
    sample: bool
    """True when this chunk reaches the end of the known tokens: sample the next one."""
    sampling: SamplingParams
    num_output_tokens: int
    """Tokens generated so far (min_tokens masking, per-request seeded generators)."""
    eos_token_id: int | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    """The request's prompt (by reference, not copied): the repetition penalty reads it."""
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens generated so far (by reference): presence, frequency and repetition penalties."""
    grammar: GrammarSpec | None = None
    """The request's structured-output grammar: its sampled rows are masked to it."""
    lora_id: int = 0
    """The LoRA adapter load its rows run under (engine/worker/lora/registry.py); 0: the base model."""


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's work. The runner applies the block moves before the forward pass, with
    blocks_to_swap_out first (or every source read before any write): a device block freed by
    a swap-out may be the destination of a copy or a swap-in in the same step. Copies and
    swap-ins may run in either order. In each layer every chunk's KV is written before any
    attention reads the cache: a chunk's context may be a prefix-cache hit on blocks that
    another chunk of the same step fills."""

    chunks: list[ScheduledChunk]
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    """(device block, cpu block) pairs to copy before the forward pass."""
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    """(cpu block, device block) pairs to copy before the forward pass."""
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    """(src, dst) device block pairs: copy-on-write of a shared partial block."""
    finished_request_ids: list[str] = field(default_factory=list)
    """Requests that ended since the last step: the runner drops their state (generators)."""

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.blocks_to_swap_out and not self.blocks_to_swap_in


@dataclass(frozen=True)
class RunnerOutput:
    sampled_token_ids: dict[str, int]
    """request_id -> the token sampled this step, for chunks with sample=True."""
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    """request_id -> the sampled token's logprobs, for requests that asked for them."""
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    """request_id -> its prompt's logprobs (tokens 1..), on the step that finished its prompt."""
    beam_candidates: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """request_id -> the 2 x width most likely next tokens with their raw logprobs, best first,
    for beam-search rows only (engine/scheduling/beam_group.py expands the beams from them)."""


@dataclass(frozen=True)
class RequestDelta:
    """What one step changed for one request: the unit the engine streams out."""

    request_id: str
    """The client-visible id; the n samples of one request share it and differ by index."""
    new_token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finish_reason: str | None = None
    """None while running; "stop", "length" or "abort" once finished."""
    index: int = 0
    """Which of the request's n samples (the OpenAI choice index)."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per new token when the request asked for logprobs."""
    queue_seconds: float | None = None
    """Seconds from the engine's arrival to the first scheduling (vllm:request_queue_time_seconds);
    None until the request was first scheduled."""
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """On the first delta of a request that asked for prompt_logprobs: one per prompt token after the first."""
    num_unreturned_tokens: int = 0
    """best_of > n: tokens the candidates that were not returned generated (usage counts them)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
