"""The scheduler with a fake runner: continuous batching, budgets, refill, stops, aborts."""

from __future__ import annotations

import pytest

from engine.outputs import RunnerOutput
from engine.request import Request, RequestStatus
from engine.scheduling.scheduler import RequestRejected, SchedulerConfig
from engine.scheduling.stop_conditions import finish_status
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec
from tests.engine.scheduling.fakes import EOS, Run, make_request, make_scheduler, reference, run_to_end, step


def expect_reference(run: Run, req: Request, max_model_len: int = 256) -> None:
    want = reference(req.prompt_token_ids, req.sampling, req.eos_token_id, max_model_len)
    res = run.results[(req.request_id, 0)]
    assert (res.tokens, res.finish_reason) == want


def test_one_request_runs_to_its_reference_output() -> None:
    sched, runner = make_scheduler()
    req = make_request(10, max_tokens=12, ignore_eos=True)
    sched.add_request(req)
    run = run_to_end(sched, runner)
    expect_reference(run, req)
    assert run.results[(req.request_id, 0)].finish_reason == "length"
    assert sched.stats().free_device_blocks == 64


def test_a_batch_with_a_tiny_budget_chunks_prefills_and_reuses_blocks() -> None:
    # 16 blocks of 4 tokens for 8 requests of up to 30 tokens: blocks must be reused.
    sched, runner = make_scheduler(num_device_blocks=16, max_num_batched_tokens=7, max_num_seqs=4)
    reqs = [make_request(3 + 3 * i, max_tokens=10 + i, ignore_eos=i % 2 == 0) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    run = run_to_end(sched, runner)
    for r in reqs:
        expect_reference(run, r)
    chunked = [c for out in run.outputs for c in out.chunks if not c.sample]
    assert chunked, "no prompt was split into chunks"
    used = {b for out in run.outputs for c in out.chunks for b in c.block_ids}
    assert used == set(range(16))
    assert sched.stats().free_device_blocks == 16


def test_token_budget_and_seat_limit_hold_and_decodes_share_steps_with_prefills() -> None:
    sched, runner = make_scheduler(max_num_batched_tokens=10, max_num_seqs=3)
    for i in range(6):
        sched.add_request(make_request(4 + 5 * i, max_tokens=6, ignore_eos=True))
    run = run_to_end(sched, runner)
    assert all(out.num_tokens <= 10 and len(out.chunks) <= 3 for out in run.outputs)
    mixed = [
        out
        for out in run.outputs
        if any(len(c.token_ids) == 1 and c.start_position > 0 for c in out.chunks)
        and any(len(c.token_ids) > 1 for c in out.chunks)
    ]
    assert mixed, "decodes and prefill chunks never shared a step"


def test_blocks_are_allocated_as_tokens_arrive() -> None:
    sched, runner = make_scheduler(block_size=4)
    req = make_request(5, max_tokens=9, ignore_eos=True)
    sched.add_request(req)
    run, held = Run(), []
    while sched.has_unfinished():
        out = step(sched, runner, run)
        held.append(len(out.chunks[0].block_ids))
    # KV for 5 prompt tokens, then one more position per step: 5..13 tokens computed.
    assert held == [2, 2, 2, 2, 3, 3, 3, 3, 4]


def test_a_finished_requests_seat_is_refilled_on_the_next_step() -> None:
    sched, runner = make_scheduler(max_num_seqs=1)
    first = make_request(4, max_tokens=3, ignore_eos=True)
    second = make_request(4, max_tokens=2, ignore_eos=True)
    sched.add_request(first)
    sched.add_request(second)
    run = run_to_end(sched, runner)
    ids = [[c.request_id for c in out.chunks] for out in run.outputs]
    assert ids == [[first.request_id]] * 3 + [[second.request_id]] * 2
    assert run.outputs[3].finished_request_ids == [first.request_id]


def test_update_reports_one_delta_per_request_with_counts() -> None:
    sched, runner = make_scheduler()
    req = make_request(6, max_tokens=2, ignore_eos=True)
    sched.add_request(req)
    out = sched.schedule()
    deltas = sched.update(out, runner.execute(out))
    assert len(deltas) == 1
    d = deltas[0]
    assert (d.request_id, d.num_prompt_tokens, d.num_output_tokens, d.finish_reason) == (
        req.request_id,
        6,
        1,
        None,
    )
    out = sched.schedule()
    (d,) = sched.update(out, runner.execute(out))
    assert d.finished and d.finish_reason == "length" and d.num_output_tokens == 2


@pytest.mark.parametrize(
    ("params", "outputs", "status"),
    [
        (SamplingParams(max_tokens=5), [3, EOS], RequestStatus.FINISHED_STOPPED),
        (SamplingParams(max_tokens=5, ignore_eos=True), [3, EOS], None),
        (SamplingParams(max_tokens=5, stop_token_ids=(7,)), [7], RequestStatus.FINISHED_STOPPED),
        (SamplingParams(max_tokens=5, min_tokens=2), [EOS], None),
        (SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(7,)), [3, 7], None),
        (SamplingParams(max_tokens=5, min_tokens=2), [3, 4, EOS], RequestStatus.FINISHED_STOPPED),
        (SamplingParams(max_tokens=2), [3, 4], RequestStatus.FINISHED_LENGTH),
        (SamplingParams(max_tokens=2, stop_token_ids=(4,)), [3, 4], RequestStatus.FINISHED_STOPPED),
        (SamplingParams(max_tokens=50), [3] * 4, RequestStatus.FINISHED_LENGTH),  # 6 + 4 = max_model_len
    ],
)
def test_stop_conditions(params: SamplingParams, outputs: list[int], status: RequestStatus | None) -> None:
    req = Request("s", [1] * 6, params, 0.0, eos_token_id=EOS)
    req.output_token_ids = outputs
    assert finish_status(req, max_model_len=10) == status


def test_a_constrained_request_stops_where_its_grammar_ended_even_before_min_tokens() -> None:
    """The sampler lets EOS through before min_tokens only when the grammar allows nothing else."""
    req = Request("g", [1] * 6, SamplingParams(max_tokens=9, min_tokens=5), 0.0, eos_token_id=EOS,
                  grammar=GrammarSpec("choice", '["ab"]'))
    req.output_token_ids = [3, EOS]
    assert finish_status(req, max_model_len=20) == RequestStatus.FINISHED_STOPPED


def test_stop_conditions_through_the_scheduler_match_the_reference() -> None:
    sched, runner = make_scheduler(max_model_len=20)
    reqs = [
        make_request(5, max_tokens=30, request_id=f"stop{i}", **kw)  # type: ignore[arg-type]
        for i, kw in enumerate(
            [
                {},
                {"ignore_eos": True},
                {"stop_token_ids": (1, 2, 3, 4)},
                {"min_tokens": 6},
                {"seed": 3, "temperature": 1.0},
            ]
        )
    ]
    for r in reqs:
        sched.add_request(r)
    run = run_to_end(sched, runner)
    for r in reqs:
        expect_reference(run, r, max_model_len=20)
    reasons = {run.results[(r.request_id, 0)].finish_reason for r in reqs}
    assert reasons == {"stop", "length"}


def test_abort_frees_at_once_and_reports_each_live_request() -> None:
    sched, runner = make_scheduler(num_device_blocks=8, max_num_seqs=1)
    running, waiting = make_request(9, max_tokens=20), make_request(4, max_tokens=20)
    sched.add_request(running)
    sched.add_request(waiting)
    run = Run()
    step(sched, runner, run)
    deltas = sched.abort_requests([running.request_id, waiting.request_id, "nobody"])
    assert [(d.request_id, d.finish_reason, d.new_token_ids) for d in deltas] == [
        (running.request_id, "abort", []),
        (waiting.request_id, "abort", []),
    ]
    assert deltas[0].num_output_tokens == 1
    assert not sched.has_unfinished() and sched.stats().free_device_blocks == 8
    sched.check_invariants()
    assert sched.abort_requests([running.request_id]) == []
    assert sched.schedule().finished_request_ids == [running.request_id, waiting.request_id]


def test_abort_between_schedule_and_update_drops_the_token() -> None:
    sched, runner = make_scheduler()
    req = make_request(4, max_tokens=5)
    sched.add_request(req)
    out = sched.schedule()
    result = runner.execute(out)
    sched.abort_requests([req.request_id])
    assert sched.update(out, result) == []
    sched.check_invariants()


def test_missing_sampled_token_is_an_error() -> None:
    sched, _ = make_scheduler()
    sched.add_request(make_request(4))
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="no token"):
        sched.update(out, RunnerOutput({}))


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (make_request([], request_id="empty"), "empty"),
        (make_request(300, request_id="long"), "context"),
        (make_request(4, n=9, request_id="wide"), "max_num_seqs"),
        (make_request(4, weight=0.0, request_id="weightless"), "weight"),
        (make_request(200, max_tokens=50, request_id="huge"), "KV blocks"),
    ],
)
def test_requests_that_can_never_run_are_rejected(req: Request, match: str) -> None:
    sched, _ = make_scheduler(num_device_blocks=40)
    with pytest.raises(RequestRejected, match=match):
        sched.add_request(req)
    assert not sched.has_unfinished()


def test_duplicate_ids_are_rejected() -> None:
    sched, _ = make_scheduler()
    sched.add_request(make_request(4, request_id="dup"))
    with pytest.raises(RequestRejected, match="in use"):
        sched.add_request(make_request(4, request_id="dup"))


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="preemption_mode"):
        SchedulerConfig(preemption_mode="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)


def test_stats_count_steps_and_the_last_step() -> None:
    sched, runner = make_scheduler()
    for _ in range(3):
        sched.add_request(make_request(4, max_tokens=2, ignore_eos=True))
    out = sched.schedule()
    sched.update(out, runner.execute(out))
    stats = sched.stats()
    assert (stats.steps, stats.running, stats.waiting, stats.last_step_num_scheduled) == (1, 3, 0, 3)
    assert stats.last_step_num_tokens == 12 and stats.total_device_blocks == 64
