"""--max-loras in the pure scheduler: no step holds more distinct adapters, a request whose adapter cannot
join is looked past (not a wall), no adapter waits forever, and adapters never share cached blocks."""

from __future__ import annotations

import dataclasses

from engine.request import Request
from engine.scheduling.lora_gate import LoraGate
from tests.engine.scheduling.fakes import (
    FakeClock,
    Run,
    make_request,
    make_scheduler,
    reference,
    run_to_end,
    step,
)
from tests.engine.scheduling.test_scheduler_beams import beam_request, drive
from tests.engine.scheduling.test_scheduler_beams import scheduler as beam_scheduler


def _adapters_of(out) -> set[int]:  # type: ignore[no-untyped-def]
    return {c.lora_id for c in out.chunks if c.lora_id}


def test_no_step_exceeds_max_loras_and_outputs_are_right_under_preemption() -> None:
    sched, runner = make_scheduler(num_device_blocks=24, max_loras=2, max_num_seqs=6)
    reqs = [make_request(6 + i % 5, max_tokens=10, lora_name=f"a{i % 4}", lora_id=1 + i % 4, n=1 + (i % 3 == 0))
            for i in range(12)] + [make_request(5, max_tokens=10) for _ in range(3)]
    for r in reqs:
        sched.add_request(r)
    run = run_to_end(sched, runner)
    assert max(len(_adapters_of(out)) for out in run.outputs) == 2
    assert sched.stats().preemptions > 0  # the memory was tight enough to preempt adapter requests
    for r in reqs:
        want, _ = reference(r.prompt_token_ids, r.sampling, r.eos_token_id, 256)
        assert run.results[(r.request_id, 0)].tokens == want


def test_a_request_whose_adapter_cannot_join_is_skipped_not_blocking() -> None:
    sched, runner = make_scheduler(max_loras=1)
    first = make_request(4, max_tokens=20, lora_name="a", lora_id=1)
    sched.add_request(first)
    run = Run()
    step(sched, runner, run)
    blocked = make_request(4, lora_name="b", lora_id=2)
    behind = [make_request(4), make_request(4, lora_name="a", lora_id=1)]  # base, and the running adapter
    for r in (blocked, *behind):
        sched.add_request(r)
    out = step(sched, runner, run)
    ids = {c.request_id for c in out.chunks}
    assert blocked.request_id not in ids and all(r.request_id in ids for r in behind)


def test_no_adapter_waits_forever_while_another_keeps_arriving() -> None:
    clock = FakeClock()
    sched, runner = make_scheduler(max_loras=1, lora_drain_s=1.0, clock=clock, max_num_seqs=4)
    run = Run()
    starving = None
    for i in range(200):
        clock.now += 0.1
        sched.add_request(make_request(4, max_tokens=3, lora_name="a", lora_id=1))  # a steady stream of "a"
        if i == 2:
            starving = make_request(4, max_tokens=3, lora_name="b", lora_id=2)
            sched.add_request(starving)
        step(sched, runner, run)
        if starving is not None and (starving.request_id, 0) in run.results:
            break
    assert starving is not None and (starving.request_id, 0) in run.results, "adapter b never ran"
    assert clock.now < 3.0  # about lora_drain_s, plus the running "a" requests finishing


def test_adapters_never_share_cached_blocks_but_one_adapter_does() -> None:
    sched, runner = make_scheduler()
    prompt = list(range(1, 14))
    run = Run()
    reqs = [make_request(prompt, max_tokens=2, lora_name="a", lora_id=1),
            make_request(prompt, max_tokens=2, lora_name="a", lora_id=3),  # a reload of "a": a new load id
            make_request(prompt, max_tokens=2, lora_name="b", lora_id=2),
            make_request(prompt, max_tokens=2),
            make_request(prompt, max_tokens=2, lora_name="a", lora_id=1)]
    for r in reqs:
        sched.add_request(r)
        run_to_end(sched, runner, run)
    cached = [run.results[(r.request_id, 0)].num_cached_tokens for r in reqs]
    assert cached == [0, 0, 0, 0, 12]


def test_the_gate_counts_only_adapters() -> None:
    gate = LoraGate(max_loras=1, drain_s=10.0)
    gate.begin_step([make_request(3, lora_id=1), make_request(3)], now=0.0)
    assert gate.admits(make_request(3)) and gate.admits(make_request(3, lora_id=1))
    assert not gate.admits(make_request(3, lora_id=2))


def test_a_request_whose_adapter_is_being_read_waits_without_starting_a_drain() -> None:
    """An evicted adapter's weights are read off the loop (engine/worker/lora/evicted_reads.py): its
    request is passed over meanwhile, under the cap or not, and others (its adapter's peers included)
    are not held back by a drain; once released it runs."""
    clock = FakeClock()
    sched, runner = make_scheduler(max_loras=2, lora_drain_s=0.5, clock=clock)
    run = Run()
    held = make_request(4, max_tokens=2, lora_name="b", lora_id=2)
    sched.add_request(held)
    sched.loras.hold(2)
    for _ in range(5):
        clock.now += 0.3  # past lora_drain_s: a drain, had the read started one, would stop "a" below
        sched.add_request(other := make_request(4, max_tokens=2, lora_name="a", lora_id=1))
        out = step(sched, runner, run)
        ids = {c.request_id for c in out.chunks}
        assert held.request_id not in ids and other.request_id in ids
    sched.loras.release(2)
    run_to_end(sched, runner, run)
    assert (held.request_id, 0) in run.results


def _adapter_beams(width: int, max_tokens: int) -> tuple[Request, Request]:
    """A long request and a beam group, both under adapter "a" (load 1)."""
    long_a = make_request(32, max_tokens=24, request_id="long", eos=None, lora_name="a", lora_id=1)
    beam = dataclasses.replace(beam_request("beam", 5, max_tokens, width), lora_name="a", lora_id=1)
    return long_a, beam


def test_every_beam_and_sample_runs_under_its_requests_adapter() -> None:
    sched, runner = beam_scheduler(64, max_loras=2)
    _, beam = _adapter_beams(4, 6)
    best_of = make_request(5, max_tokens=6, request_id="bo", lora_name="b", lora_id=2)
    best_of = dataclasses.replace(best_of, sampling=dataclasses.replace(best_of.sampling, best_of=3))
    sched.add_request(beam)
    sched.add_request(best_of)
    seen: dict[str, set[int]] = {}  # client id -> the adapter loads its samples' chunks ran under
    ids: set[str] = set()
    for _ in range(100):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        for c in out.chunks:
            seen.setdefault(c.request_id.split("#")[0], set()).add(c.lora_id)
            ids.add(c.request_id)
        sched.update(out, runner.execute(out))
    assert not sched.has_unfinished()
    assert seen == {"beam": {1}, "bo": {2}}
    assert ids == {f"beam#{i}" for i in range(4)} | {f"bo#{i}" for i in range(3)}  # every fork ran


def test_a_drain_never_splits_a_beam_group_it_would_then_wait_on() -> None:
    """max_loras 1: "b" waits, so the gate drains "a"; the beam group of "a" is swapped out and its
    first beam comes back once the long "a" request ends. Its siblings must follow (the group runs
    whole; its parked beams wait for them) even while draining, or "a" never drains and all stall."""
    sched, runner = beam_scheduler(16, max_loras=1, lora_drain_s=0.0, clock=FakeClock(), max_num_seqs=8)
    long_a, beam = _adapter_beams(4, 10)
    sched.add_request(long_a)
    sched.add_request(beam)
    for _ in range(2):
        out = sched.schedule()
        sched.update(out, runner.execute(out))
    sched.add_request(make_request(4, max_tokens=3, request_id="b", eos=None, lora_name="b", lora_id=2))
    final = drive(sched, runner, watch="beam")  # raises "no progress" on a stall
    assert sched.stats().preemptions > 0  # the group did leave and come back
    assert {k for k in final if k[0] == "beam"} == {("beam", i) for i in range(4)}
    assert ("b", 0) in final and ("long", 0) in final
