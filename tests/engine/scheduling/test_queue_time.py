"""The queue time the engine reports (vllm:request_queue_time_seconds): from add_request to the first
admission, on every delta of the request once it was scheduled, fixed across preemptions."""

from __future__ import annotations

from engine.outputs import RequestDelta
from engine.scheduling.scheduler import Scheduler
from tests.engine.scheduling.fakes import FakeClock, FakeRunner, make_request, make_scheduler


def run_timed(sched: Scheduler, runner: FakeRunner, clock: FakeClock, step_s: float = 1.0) -> list[RequestDelta]:
    """Run to the end, the clock moving step_s after each step; every delta."""
    deltas: list[RequestDelta] = []
    while sched.has_unfinished():
        out = sched.schedule()
        deltas += sched.update(out, runner.execute(out))
        clock.now += step_s
    return deltas


def test_a_request_waiting_for_a_seat_reports_the_wait_until_its_first_scheduling() -> None:
    clock = FakeClock()
    sched, runner = make_scheduler(max_num_seqs=1, clock=clock)
    clock.now = 10.0
    sched.add_request(make_request(3, max_tokens=3, ignore_eos=True, request_id="first"))
    sched.add_request(make_request(3, max_tokens=2, ignore_eos=True, request_id="second"))
    deltas = run_timed(sched, runner, clock)
    first = [d.queue_seconds for d in deltas if d.request_id == "first"]
    second = [d.queue_seconds for d in deltas if d.request_id == "second"]
    assert first == [0.0, 0.0, 0.0]  # scheduled in the step it arrived before
    assert second == [3.0, 3.0]  # it waited for the three steps of "first"
    assert deltas[-1].finished and deltas[-1].request_id == "second"


def test_every_sample_of_n_reports_the_requests_queue_time() -> None:
    clock = FakeClock()
    sched, runner = make_scheduler(max_num_seqs=4, clock=clock)
    sched.add_request(make_request(3, max_tokens=2, ignore_eos=True, request_id="busy"))
    clock.now = 0.5
    sched.add_request(make_request(5, max_tokens=2, n=3, ignore_eos=True, request_id="many"))
    clock.now = 2.0
    deltas = run_timed(sched, runner, clock)
    many = [d for d in deltas if d.request_id == "many"]
    assert {d.index for d in many} == {0, 1, 2}
    assert {d.queue_seconds for d in many} == {1.5}


def test_a_request_aborted_while_queued_has_no_queue_time() -> None:
    sched, _ = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request(3, max_tokens=2, request_id="never"))
    (aborted,) = sched.abort_requests(["never"])
    assert aborted.finish_reason == "abort" and aborted.queue_seconds is None


def test_a_preempted_request_keeps_the_queue_time_of_its_first_scheduling() -> None:
    clock = FakeClock()
    # Two blocks of 4 tokens for two growing requests: one is preempted (recomputed) and re-admitted.
    sched, runner = make_scheduler(num_device_blocks=4, num_cpu_blocks=0, max_num_seqs=2, clock=clock,
                                   preemption_mode="recompute")
    sched.add_request(make_request(4, max_tokens=6, ignore_eos=True, request_id="a"))
    sched.add_request(make_request(4, max_tokens=6, ignore_eos=True, request_id="b"))
    deltas = run_timed(sched, runner, clock)
    assert sched.stats().preemptions >= 1
    assert {d.queue_seconds for d in deltas} == {0.0}
