"""Counters the engine server keeps about its own loop, merged with the core's counts into Stats.

The core knows its queues and block pool (CoreCounts); the server knows how many
steps ran and how many requests shared each step (the batching actually
achieved). Plain Python: no torch, no zmq.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.protocol import Stats


@dataclass(frozen=True)
class CoreCounts:
    """A snapshot of the scheduler's queues and the KV block pool."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int


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

    def record_step(self, num_requests: int, step_seconds: float = 0.0, loop_seconds: float = 0.0) -> None:
        self.num_steps += 1
        self.total_requests_in_steps += num_requests
        self.max_requests_per_step = max(self.max_requests_per_step, num_requests)
        self.step_seconds += step_seconds
        self.loop_seconds += loop_seconds

    def snapshot(self, core: CoreCounts, num_gateways: int, num_finished: int) -> Stats:
        mean = self.total_requests_in_steps / self.num_steps if self.num_steps else 0.0
        return Stats(
            num_running=core.num_running, num_waiting=core.num_waiting, num_swapped=core.num_swapped,
            num_free_blocks=core.num_free_blocks, num_total_blocks=core.num_total_blocks,
            num_preemptions=core.num_preemptions, num_steps=self.num_steps, num_finished=num_finished,
            num_aborted=self.num_aborted, max_requests_per_step=self.max_requests_per_step,
            mean_requests_per_step=mean, num_gateways=num_gateways,
            step_seconds=self.step_seconds, loop_seconds=self.loop_seconds,
        )
