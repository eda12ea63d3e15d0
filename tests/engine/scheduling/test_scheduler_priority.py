"""Priorities, aging, preemption choices and weighted fair share, with the fake runner.

Lower priority value = more urgent."""

from __future__ import annotations

from collections import Counter

from engine.scheduling.config import SchedulerConfig
from engine.scheduling.preemption import pick_victim, preempt_kind
from tests.engine.scheduling.fakes import (
    EOS,
    FakeClock,
    Run,
    make_request,
    make_scheduler,
    reference,
    run_to_end,
    step,
)


def first_step(run: Run, rid: str) -> int:
    res = run.results[(rid, 0)]
    assert res.first_step is not None
    return res.first_step


def check_outputs(run: Run, reqs) -> None:  # type: ignore[no-untyped-def]
    for r in reqs:
        want = reference(r.prompt_token_ids, r.sampling, EOS, 256)
        assert (run.results[(r.request_id, 0)].tokens, run.results[(r.request_id, 0)].finish_reason) == want


def flood_then_urgent(policy: str):  # type: ignore[no-untyped-def]
    """Low-urgency long requests fill memory; an urgent short one arrives at step 4."""
    sched, runner = make_scheduler(num_device_blocks=16, block_size=4, max_num_seqs=8, policy=policy)
    lows = [
        make_request(14, max_tokens=30, priority=5, ignore_eos=True, request_id=f"low{i}") for i in range(4)
    ]
    for r in lows:
        sched.add_request(r)
    run = Run()
    for _ in range(4):
        step(sched, runner, run)
    urgent = make_request(6, max_tokens=3, priority=0, ignore_eos=True, request_id="urgent")
    sched.add_request(urgent)
    run = run_to_end(sched, runner, run)
    check_outputs(run, [*lows, urgent])
    return sched, run


def test_an_urgent_request_preempts_under_memory_pressure() -> None:
    sched, run = flood_then_urgent("priority")
    assert first_step(run, "urgent") == 5  # the very next step
    assert sched.stats().priority_preemptions >= 1
    fcfs_sched, fcfs_run = flood_then_urgent("fcfs")
    assert first_step(fcfs_run, "urgent") > 10
    assert fcfs_sched.stats().priority_preemptions == 0


def test_no_preemption_below_the_priority_gap() -> None:
    sched, runner = make_scheduler(max_num_seqs=1, preemption_priority_gap=3)
    sched.add_request(make_request(4, max_tokens=6, priority=5, ignore_eos=True, request_id="low"))
    run = Run()
    step(sched, runner, run)
    sched.add_request(make_request(4, max_tokens=1, priority=3, request_id="nearly"))
    run = run_to_end(sched, runner, run)
    assert first_step(run, "nearly") == 7 and sched.stats().preemptions == 0


def test_an_urgent_request_takes_a_seat_from_a_less_urgent_one() -> None:
    sched, runner = make_scheduler(max_num_seqs=2)
    lows = [make_request(4, max_tokens=20, priority=2, ignore_eos=True, request_id=f"l{i}") for i in range(2)]
    for r in lows:
        sched.add_request(r)
    run = Run()
    step(sched, runner, run)
    lows[1].arrival_time = 0.0
    step(sched, runner, run)
    sched.add_request(make_request(4, max_tokens=2, priority=0, ignore_eos=True, request_id="vip"))
    out = step(sched, runner, run)
    assert "vip" in [c.request_id for c in out.chunks]
    # The victim is the least urgent, then the latest arrival at equal cost: l1.
    assert "l1" not in [c.request_id for c in out.chunks] and out.blocks_to_swap_out
    run = run_to_end(sched, runner, run)
    check_outputs(run, lows)


def test_victims_are_least_urgent_then_cheapest() -> None:
    a = make_request(4, priority=1, request_id="a")
    b = make_request(4, priority=3, request_id="b")
    c = make_request(4, priority=3, request_id="c")
    a.num_computed_tokens, b.num_computed_tokens, c.num_computed_tokens = 1, 40, 9
    seqs = {"a": 0, "b": 1, "c": 2}

    def level(r):  # type: ignore[no-untyped-def]
        return r.priority

    assert pick_victim([a, b, c], level, lambda r: seqs[r.request_id]) is c
    assert pick_victim([a, b], level, lambda r: seqs[r.request_id]) is b
    assert pick_victim([], level, lambda r: 0) is None


def test_memory_pressure_never_preempts_the_most_urgent_running_request() -> None:
    sched, runner = make_scheduler(num_device_blocks=10, block_size=2, max_num_seqs=4)
    reqs = [
        make_request(4, max_tokens=12, priority=p, ignore_eos=True, request_id=f"p{p}") for p in (0, 1, 2)
    ]
    for r in reqs:
        sched.add_request(r)
    run = run_to_end(sched, runner)
    assert sched.stats().preemptions >= 1
    assert all(any(c.request_id == "p0" for c in out.chunks) for out in run.outputs[:12])
    check_outputs(run, reqs)


def test_swap_vs_recompute_is_chosen_by_cost() -> None:
    cfg = SchedulerConfig(swap_seconds_per_block=1e-3, recompute_seconds_per_token=1e-3)
    assert preempt_kind(cfg, num_blocks=2, num_computed_tokens=8, cpu_free=10) == "swap"
    assert preempt_kind(cfg, num_blocks=4, num_computed_tokens=5, cpu_free=10) == "recompute"
    assert preempt_kind(cfg, num_blocks=2, num_computed_tokens=8, cpu_free=1) == "recompute"
    swap_only = SchedulerConfig(preemption_mode="swap")
    assert preempt_kind(swap_only, num_blocks=9, num_computed_tokens=1, cpu_free=9) == "swap"
    assert preempt_kind(swap_only, num_blocks=9, num_computed_tokens=1, cpu_free=8) == "recompute"


def test_a_full_cpu_pool_falls_back_to_recompute_and_stats_say_so() -> None:
    for cpu_blocks, kind in ((0, "recomputes"), (32, "swaps_out")):
        sched, runner = make_scheduler(
            num_device_blocks=8, num_cpu_blocks=cpu_blocks, block_size=2, preemption_mode="swap"
        )
        reqs = [make_request(4, max_tokens=9, ignore_eos=True) for _ in range(3)]
        for r in reqs:
            sched.add_request(r)
        run = run_to_end(sched, runner)
        stats = sched.stats()
        assert getattr(stats, kind) == stats.preemptions >= 1
        if kind == "swaps_out":
            assert stats.swaps_in == stats.swaps_out and stats.blocks_swapped_in == stats.blocks_swapped_out
        check_outputs(run, reqs)


def test_after_preempting_for_memory_nothing_new_is_admitted_that_step() -> None:
    sched, runner = make_scheduler(num_device_blocks=8, block_size=2, max_num_seqs=4)
    for i in range(2):
        sched.add_request(make_request(4, max_tokens=10, ignore_eos=True, request_id=f"run{i}"))
    run = Run()
    for _ in range(5):  # both reach 8 tokens: all 8 blocks held, both need a 5th block next
        step(sched, runner, run)
    assert sched.stats().free_device_blocks == 0 and sched.stats().preemptions == 0
    sched.add_request(make_request(1, max_tokens=1, request_id="tiny"))
    out = step(sched, runner, run)
    assert sched.stats().preemptions == 1
    assert sched.stats().free_device_blocks >= 1, "tiny would have fitted"
    assert "tiny" not in [c.request_id for c in out.chunks]
    run = run_to_end(sched, runner, run)
    assert first_step(run, "tiny") > 6


def test_swapped_requests_resume_before_newer_requests_of_equal_urgency() -> None:
    sched, runner = make_scheduler(num_device_blocks=8, block_size=2, max_num_seqs=4, swap_in_watermark=0.0)
    for i in range(2):
        sched.add_request(make_request(4, max_tokens=10, ignore_eos=True, request_id=f"old{i}"))
    run = Run()
    while sched.stats().swaps_out == 0:
        step(sched, runner, run)
    sched.add_request(make_request(2, max_tokens=2, ignore_eos=True, request_id="newer"))
    swapped = sched.swapped[0].request_id
    resumed_at = newer_at = None
    while sched.has_unfinished():
        out = step(sched, runner, run)
        ids = [c.request_id for c in out.chunks]
        resumed_at = resumed_at or (run.steps if swapped in ids and out.blocks_to_swap_in else None)
        newer_at = newer_at or (run.steps if "newer" in ids else None)
    assert resumed_at is not None and newer_at is not None and resumed_at <= newer_at


def test_aging_serves_the_least_urgent_request_under_a_stream_of_urgent_ones() -> None:
    waits = {}
    for rate in (0.0, 0.5):
        clock = FakeClock()
        sched, runner = make_scheduler(max_num_seqs=1, aging_rate=rate, clock=clock)
        sched.add_request(make_request(3, max_tokens=2, priority=4, ignore_eos=True, request_id="patient"))
        run = Run()
        for t in range(60):
            if t < 40:
                sched.add_request(make_request(3, max_tokens=1, priority=0, request_id=f"u{rate}-{t}"))
            step(sched, runner, run)
            clock.now += 1.0
        run = run_to_end(sched, runner, run)
        waits[rate] = first_step(run, "patient")
        assert run.results[("patient", 0)].finish_reason == "length"
    # Without aging it waits for the whole stream; at 0.5 levels/s it gains 4 levels in 8 s.
    assert waits[0.0] > 40 and waits[0.5] <= 12


def tenant_shares(weights: dict[str, float], policy: str = "priority") -> dict[str, float]:
    sched, runner = make_scheduler(
        num_device_blocks=256, max_num_seqs=4, max_num_batched_tokens=64, policy=policy
    )
    for i in range(80):
        for tenant, weight in weights.items():
            req = make_request(
                8, max_tokens=8, ignore_eos=True, tenant_id=tenant, weight=weight, request_id=f"{tenant}{i}"
            )
            sched.add_request(req)
    tokens, run = Counter[str](), Run()
    # Measure while every tenant is still backlogged.
    while all(any(r.tenant_id == t for r in sched.waiting) for t in weights):
        out = step(sched, runner, run, check=False)
        for c in out.chunks:
            tokens[c.request_id.rstrip("0123456789")] += len(c.token_ids)
    total = sum(tokens.values())
    return {t: tokens[t] / total for t in weights}


def test_two_tenants_flooding_one_tier_get_token_shares_by_weight() -> None:
    for weights in ({"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0}):
        shares = tenant_shares(weights)
        total = sum(weights.values())
        for tenant, weight in weights.items():
            target = weight / total
            assert abs(shares[tenant] - target) <= 0.1 * target, (weights, shares)


def test_fcfs_ignores_priority_and_tenants() -> None:
    sched, runner = make_scheduler(max_num_seqs=1, policy="fcfs")
    sched.add_request(make_request(3, max_tokens=1, priority=9, request_id="first"))
    sched.add_request(make_request(3, max_tokens=1, priority=0, request_id="second"))
    run = run_to_end(sched, runner)
    assert first_step(run, "first") < first_step(run, "second")
    shares = tenant_shares({"a": 1.0, "b": 3.0}, policy="fcfs")
    assert abs(shares["a"] - 0.5) < 0.05  # arrival order alternates the tenants


def test_a_tenant_returning_from_idle_gets_no_credit_for_it() -> None:
    sched, runner = make_scheduler(num_device_blocks=256, max_num_seqs=2, max_num_batched_tokens=64)
    run = Run()
    sched.add_request(make_request(8, max_tokens=2, ignore_eos=True, tenant_id="b", request_id="b-early"))
    run = run_to_end(sched, runner, run)
    # Tenant a works alone for a while, never queueing more than it runs.
    for i in range(30):
        sched.add_request(
            make_request(8, max_tokens=4, ignore_eos=True, tenant_id="a", request_id=f"a-solo{i}")
        )
        run = run_to_end(sched, runner, run)
    # Now both flood: b must not get every seat until it has "caught up" with a's past use.
    for i in range(20):
        for tenant in ("b", "a"):
            sched.add_request(
                make_request(8, max_tokens=4, ignore_eos=True, tenant_id=tenant, request_id=f"{tenant}{i}")
            )
    tokens = Counter[str]()
    for _ in range(20):
        out = step(sched, runner, run, check=False)
        for c in out.chunks:
            tokens[c.request_id[0]] += len(c.token_ids)
    assert abs(tokens["a"] / (tokens["a"] + tokens["b"]) - 0.5) < 0.1, tokens
