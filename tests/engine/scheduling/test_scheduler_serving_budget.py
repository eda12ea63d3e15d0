"""The serving mode's prefill budget: while streams generate, a step computes at most that many prompt tokens."""

from __future__ import annotations

from engine.outputs import SchedulerOutput
from tests.engine.scheduling.fakes import Run, make_request, make_scheduler, run_to_end, step
from tests.engine.scheduling.test_scheduler import expect_reference


def prompt_tokens(out: SchedulerOutput, prompt_len: dict[str, int]) -> int:
    return sum(min(len(c.token_ids), max(prompt_len[c.request_id] - c.start_position, 0)) for c in out.chunks)


def test_new_prompts_are_chunked_to_the_budget_while_streams_decode() -> None:
    sched, runner = make_scheduler(num_device_blocks=200, max_num_batched_tokens=256,
                                   max_prefill_tokens_while_decoding=16)
    first = [make_request(8, max_tokens=40, ignore_eos=True) for _ in range(3)]
    for r in first:
        sched.add_request(r)
    run = Run()
    out = step(sched, runner, run)
    assert prompt_tokens(out, {r.request_id: 8 for r in first}) == 24  # nobody generating yet: no cap
    late = [make_request(100, max_tokens=5, ignore_eos=True) for _ in range(2)]
    for r in late:
        sched.add_request(r)
    lens = {r.request_id: r.num_prompt_tokens for r in first + late}
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in late):
        out = step(sched, runner, run)
        decodes = [c for c in out.chunks if c.request_id in {r.request_id for r in first}]
        assert len(decodes) == 3  # every stream advances in every step
        assert 0 < prompt_tokens(out, lens) <= 16
    run_to_end(sched, runner, run)
    for r in first + late:
        expect_reference(run, r)


def test_without_the_mode_a_prompt_takes_the_whole_step_budget() -> None:
    sched, runner = make_scheduler(num_device_blocks=200, max_num_batched_tokens=256)
    stream = make_request(8, max_tokens=40, ignore_eos=True)
    sched.add_request(stream)
    run = Run()
    step(sched, runner, run)
    late = make_request(100, max_tokens=5, ignore_eos=True)
    sched.add_request(late)
    out = step(sched, runner, run)
    assert prompt_tokens(out, {stream.request_id: 8, late.request_id: 100}) == 100
