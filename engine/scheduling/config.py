"""The scheduler's knobs (`SchedulerConfig`) and what it reports (`SchedulerStats`).

Both are plain data: the config is frozen and validated once; the scheduler
never writes back into it. Values derived at start-up (how many KV blocks fit)
are passed to the scheduler separately. Pure Python: no torch, no zmq.

Priority convention (vLLM's): a LOWER integer is MORE urgent; 0 is the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PreemptionMode = Literal["swap", "recompute", "auto"]
Policy = Literal["priority", "fcfs"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    """Most requests (samples) running at once; also bounds the number of decodes in a step."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step: prefill chunks and decodes together."""
    max_model_len: int = 2048
    """Prompt plus output never exceeds this; a request reaching it finishes with "length"."""
    enable_prefix_caching: bool = True
    """Reuse the KV of full blocks whose (salted, chained) hash matches an earlier request's."""
    policy: Policy = "priority"
    """"priority": order by (aged) priority, fair share, arrival; urgent requests may preempt.
    "fcfs": arrival order only, priorities ignored (the baseline of `pageserve bench priority`)."""
    preemption_priority_gap: int = 1
    """A waiting request preempts a running one only if it is at least this many levels more
    urgent (by static priority), and only when memory or seats are short."""
    aging_rate: float = 0.1
    """Priority levels a queued request gains per second waited (0 disables aging): at 0.1 a
    request gains one level every 10 s, so the least urgent class never starves."""
    preemption_mode: PreemptionMode = "auto"
    """How a victim gives back its blocks: copy them to the CPU pool ("swap"), drop them and
    re-prefill later ("recompute"), or choose per victim by estimated cost ("auto"). A swap
    falls back to recompute when the CPU pool is full."""
    swap_in_watermark: float = 0.02
    """Fraction of device blocks that must stay free after a swapped request is resumed
    (ignored when nothing runs, so a lone request always resumes)."""
    admission_watermark: float = 0.01
    """Fraction of device blocks kept free when admitting a new request (room for decodes)."""
    swap_seconds_per_block: float = 2e-4
    """Cost model for "auto": seconds to copy one block one way between device and CPU."""
    recompute_seconds_per_token: float = 1.5e-3
    """Cost model for "auto": seconds to recompute one token's KV (one forward of one token)."""
    long_prefill_token_threshold: int = 0
    """Largest prefill chunk one request gets per step (0: only the step budget limits it);
    a cap keeps decodes of other requests flowing while a long prompt is prefilled."""
    max_prefill_tokens_while_decoding: int = 0
    """Serving mode: prompt tokens one step may compute while any running request is generating
    (0: only the step budget limits them). A prompt step stalls every stream for its whole
    length; this bounds the stall (the engine process defaults to it, offline runs do not)."""
    prefill_stall_factor: float = 0.0
    """Serving mode, in time: while streams generate, a step with prompt tokens may take at most this
    many times a decode-only step, as measured on this host as the engine runs
    (engine/scheduling/step_cost.py); max_prefill_tokens_while_decoding stays the cap in tokens.
    0: the token cap alone."""
    prefill_backlog_drain_s: float = 0.0
    """Serving mode, with prefill_stall_factor: while prompt tokens wait, steps carry at least enough
    of them to drain the backlog within about this many seconds, TTFT bought with longer steps
    (StepCosts.backlog_drain_s). 0: off."""
    ttft_target_s: float = 0.0
    """Serving mode: a prompt's first token is due this long after it was queued. While streams generate, each
    step carries at least the prompt tokens that let every waiting prompt (earliest deadline first) finish its
    prefill by then at the measured step costs, within itl_target_s (engine/scheduling/slo.py). 0: off."""
    itl_target_s: float = 0.0
    """Serving mode: the longest step that the queue's floors or a TTFT deadline may plan while streams generate
    (the gap it puts between two tokens of every stream); deadline lifts routinely stop at ttft_stall_limit, only
    bursts reach this. When both targets cannot be met the ITL target wins: the prompt comes late. A target the
    stall factor's own step already passes (a big model) holds lifts to that step and leaves the floors their own
    bound (slo.py). 0: no bound."""
    ttft_stall_limit: float = 0.0
    """Serving mode, with ttft_target_s: a step lifted for a deadline routinely takes at most this many decode
    steps (a few bursts a minute: up to itl_target_s). Under 3, closed-loop streams keep p99 ITL under 3x the
    median; higher buys TTFT at light load with the streams' smoothness."""

    max_loras: int = 4
    """Distinct LoRA adapters among the running requests, so in any step (base requests not counted).
    A queued request whose adapter cannot join is skipped, not a reason to stop admitting others."""
    lora_drain_s: float = 5.0
    """A request skipped for its adapter this long makes the scheduler drain: no more requests of the
    running adapters are admitted until its adapter fits, so no adapter waits forever."""

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        if self.lora_drain_s < 0:
            raise ValueError("lora_drain_s must be non-negative")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.policy not in ("priority", "fcfs"):
            raise ValueError(f"policy must be 'priority' or 'fcfs', not {self.policy!r}")
        if self.preemption_mode not in ("swap", "recompute", "auto"):
            raise ValueError(f"preemption_mode must be swap|recompute|auto, not {self.preemption_mode!r}")
        if self.preemption_priority_gap < 1:
            raise ValueError("preemption_priority_gap must be at least 1")
        if self.aging_rate < 0:
            raise ValueError("aging_rate must be non-negative")
        for name in ("swap_in_watermark", "admission_watermark"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be non-negative")
        if self.max_prefill_tokens_while_decoding < 0:
            raise ValueError("max_prefill_tokens_while_decoding must be non-negative")
        if self.prefill_stall_factor and self.prefill_stall_factor <= 1.0:
            raise ValueError("prefill_stall_factor must be above 1 (or 0: off)")
        if self.prefill_backlog_drain_s < 0:
            raise ValueError("prefill_backlog_drain_s must be non-negative (0: off)")
        if self.ttft_target_s < 0 or self.itl_target_s < 0:
            raise ValueError("ttft_target_s and itl_target_s must be non-negative (0: off)")
        if self.ttft_stall_limit and self.ttft_stall_limit <= 1.0:
            raise ValueError("ttft_stall_limit must be above 1 (or 0: off)")


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    waiting: int
    swapped: int
    free_device_blocks: int
    """Includes cached blocks no request holds (they are evicted on demand)."""
    total_device_blocks: int
    free_cpu_blocks: int
    total_cpu_blocks: int
    cached_blocks: int
    """Device blocks findable in the prefix cache, held or not."""
    preemptions: int
    """Victims chosen, for memory (running requests needing blocks) or for an urgent arrival."""
    priority_preemptions: int
    """The part of `preemptions` made to admit a more urgent waiting request."""
    swaps_out: int
    swaps_in: int
    recomputes: int
    blocks_swapped_out: int
    blocks_swapped_in: int
    prefix_cache_hit_tokens: int
    prefix_cache_query_tokens: int
    steps: int
    last_step_num_scheduled: int
    """Requests with a chunk in the last schedule() call."""
    last_step_num_tokens: int
