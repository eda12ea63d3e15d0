"""The engine's own counters that reach /metrics through Stats: tokens, and the core's totals."""

from __future__ import annotations

from engine.outputs import RequestDelta
from engine.serving.step_stats import CoreCounts, StepStats


def test_prompt_counted_once_per_request_and_every_generated_token() -> None:
    s = StepStats()
    s.record_tokens([RequestDelta("a", [5], 10, 1, 0), RequestDelta("a", [6], 10, 1, 0, index=1),
                     RequestDelta("b", [], 7, 0, 0)])  # b: a prefill chunk, no token yet
    s.record_tokens([RequestDelta("a", [7], 10, 2, 0), RequestDelta("b", [8, 9], 7, 2, 0)])
    assert s.num_prompt_tokens == 10 + 7
    assert s.num_generation_tokens == 5
    stats = s.snapshot(CoreCounts(1, 2, 3, 40, 100, 4, prefix_cache_queries=50, prefix_cache_hits=20,
                                  num_swaps_out=3, num_recomputes=1, num_free_cpu_blocks=8, num_total_cpu_blocks=10),
                       num_gateways=2, num_finished=0)
    assert (stats.num_prompt_tokens, stats.num_generation_tokens) == (17, 5)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_swaps_out, stats.num_recomputes) == (
        50, 20, 3, 1)
    assert (stats.num_free_cpu_blocks, stats.num_total_cpu_blocks) == (8, 10) and stats.started_at > 0
