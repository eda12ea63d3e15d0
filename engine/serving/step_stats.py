"""Counters the engine server keeps about its own loop, merged with the core's counts into Stats.

The core knows its queues and block pool (CoreCounts); the server knows how many
steps ran, how many requests shared each step (the batching actually
achieved) and how many prompt and generated tokens went out. `num_steps` is
also the engine's heartbeat: a gateway that sees it stand still while work is
in flight knows the loop is stuck (gateway/engine_link.py). Plain Python: no
torch, no zmq.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from engine.outputs import RequestDelta
from shared.protocol import PriorityLoad, Stats, TenantLoad


@dataclass(frozen=True)
class CoreCounts:
    """A snapshot of the scheduler's queues, the KV block pools and the scheduler's running totals."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_swaps_out: int = 0
    num_recomputes: int = 0
    num_free_cpu_blocks: int = 0
    num_total_cpu_blocks: int = 0
    max_loras: int = 0
    """The LoRA figures (engine/worker/lora/figures.py), Stats' fields by the same names; 0/empty: LoRA off."""
    lora_running: list[str] = field(default_factory=list)
    lora_waiting: list[str] = field(default_factory=list)
    lora_loaded: int = 0
    lora_resident: int = 0
    lora_evictions: int = 0
    lora_load_buckets: list[int] = field(default_factory=list)
    lora_load_seconds: float = 0.0


@dataclass
class StepStats:
    num_steps: int = 0
    num_aborted: int = 0
    max_requests_per_step: int = 0
    total_requests_in_steps: int = 0
    step_seconds: float = 0.0
    """Time inside core.step() (the model and the scheduler)."""
    loop_seconds: float = 0.0
    """Time of whole busy loop turns: core.step() plus draining messages and sending outputs."""
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    started_at: float = field(default_factory=time.time)

    def record_step(self, num_requests: int, step_seconds: float = 0.0, loop_seconds: float = 0.0) -> None:
        self.num_steps += 1
        self.total_requests_in_steps += num_requests
        self.max_requests_per_step = max(self.max_requests_per_step, num_requests)
        self.step_seconds += step_seconds
        self.loop_seconds += loop_seconds

    def record_tokens(self, deltas: Iterable[RequestDelta]) -> None:
        """Count generated tokens, and a request's prompt once, with the first token of its first sample."""
        for d in deltas:
            self.num_generation_tokens += len(d.new_token_ids)
            if d.index == 0 and d.new_token_ids and d.num_output_tokens == len(d.new_token_ids):
                self.num_prompt_tokens += d.num_prompt_tokens

    def snapshot(self, core: CoreCounts, num_gateways: int, num_finished: int,
                 loads: tuple[list[PriorityLoad], list[TenantLoad]] = ([], [])) -> Stats:
        mean = self.total_requests_in_steps / self.num_steps if self.num_steps else 0.0
        return Stats(
            **asdict(core),  # CoreCounts' fields are Stats fields by the same names
            num_steps=self.num_steps, num_finished=num_finished,
            num_aborted=self.num_aborted, max_requests_per_step=self.max_requests_per_step,
            mean_requests_per_step=mean, num_gateways=num_gateways,
            step_seconds=self.step_seconds, loop_seconds=self.loop_seconds,
            num_prompt_tokens=self.num_prompt_tokens, num_generation_tokens=self.num_generation_tokens,
            started_at=self.started_at, by_priority=loads[0], by_tenant=loads[1],
        )
