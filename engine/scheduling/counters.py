"""Running totals the scheduler reports through `Scheduler.stats()` (pure bookkeeping)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduling.block_manager import BlockManager, BlockPairs
from engine.scheduling.config import SchedulerStats


@dataclass
class Counters:
    preemptions: int = 0
    priority_preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    steps: int = 0
    last_step_num_scheduled: int = 0
    last_step_num_tokens: int = 0

    def preempted(self, swap_pairs: BlockPairs | None, urgent: bool) -> None:
        """One victim: swapped out if `swap_pairs` is not None, else recomputed."""
        self.preemptions += 1
        self.priority_preemptions += urgent
        if swap_pairs is None:
            self.recomputes += 1
        else:
            self.swaps_out += 1
            self.blocks_swapped_out += len(swap_pairs)

    def swapped_in(self, num_blocks: int) -> None:
        self.swaps_in += 1
        self.blocks_swapped_in += num_blocks

    def prefix_lookup(self, hit_tokens: int, query_tokens: int) -> None:
        self.prefix_cache_hit_tokens += hit_tokens
        self.prefix_cache_query_tokens += query_tokens

    def end_step(self, num_scheduled: int, num_tokens: int) -> None:
        self.steps += 1
        self.last_step_num_scheduled = num_scheduled
        self.last_step_num_tokens = num_tokens

    def snapshot(self, running: int, waiting: int, swapped: int, bm: BlockManager) -> SchedulerStats:
        return SchedulerStats(
            running=running,
            waiting=waiting,
            swapped=swapped,
            free_device_blocks=bm.num_free_device_blocks,
            total_device_blocks=bm.device.num_blocks,
            free_cpu_blocks=bm.num_free_cpu_blocks,
            total_cpu_blocks=bm.num_cpu_blocks,
            cached_blocks=bm.device.num_cached,
            preemptions=self.preemptions,
            priority_preemptions=self.priority_preemptions,
            swaps_out=self.swaps_out,
            swaps_in=self.swaps_in,
            recomputes=self.recomputes,
            blocks_swapped_out=self.blocks_swapped_out,
            blocks_swapped_in=self.blocks_swapped_in,
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.prefix_cache_query_tokens,
            steps=self.steps,
            last_step_num_scheduled=self.last_step_num_scheduled,
            last_step_num_tokens=self.last_step_num_tokens,
        )
