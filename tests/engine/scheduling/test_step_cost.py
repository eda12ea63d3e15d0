"""engine/scheduling/step_cost.py: the serving budget in time, learnt from the steps the engine has timed.

The fake host below has affine costs, as a CPU does: a decode-only step of n rows takes
20 ms + 1 ms x n, and p prompt tokens beside it add 8 ms (the chunk's attention call, new product
shapes) + 0.9 ms x p. At stall factor 2.5 and 8 rows the largest chunk that keeps a step under
2.5 x 28 ms is (42 - 8) / 0.9 = 37.8 tokens; at 64 rows, (126 - 8) / 0.9 = 131 tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.step_cost import (
    BACKLOG_AGE_S,
    FIRST_PROMPT_TOKENS,
    MIN_PROMPT_TOKENS,
    SATURATED_STALL,
    StepCosts,
)
from shared.sampling import SamplingParams
from tests.engine.scheduling.fakes import FakeClock, FakeRunner, Run, make_request, make_scheduler, step
from tests.engine.scheduling.test_scheduler_serving_budget import prompt_tokens

CAP = 256


def _step(decodes: int, prompt_tokens: int = 0) -> SchedulerOutput:
    params = SamplingParams(max_tokens=4)
    chunks = [ScheduledChunk(f"d{i}", [1], 10, [0], True, params, 1) for i in range(decodes)]
    if prompt_tokens:
        chunks.append(ScheduledChunk("p", [1] * prompt_tokens, 0, [0], False, params, 0))
    return SchedulerOutput(chunks=chunks)


def decode_s(rows: int) -> float:
    return 0.020 + 0.001 * rows


def mixed_s(rows: int, prompt: int) -> float:
    return decode_s(rows) + 0.008 + 0.0009 * prompt


def limit(rows: int, factor: float = 2.5) -> float:
    return ((factor - 1.0) * decode_s(rows) - 0.008) / 0.0009


def run_host(costs: StepCosts, rows: int, steps: int, tail_every: int = 0, tail: int = 10) -> list[int]:
    """Alternate decode-only and mixed steps on the fake host; every `tail_every`-th mixed step carries
    only a prompt's short tail. Returns the budgets the steps were given."""
    budgets = []
    for i in range(steps):
        costs.observe(_step(rows), decode_s(rows))
        budget = costs.prompt_budget(CAP)
        budgets.append(budget)
        carried = min(tail, budget) if tail_every and i % tail_every == 0 else budget
        costs.observe(_step(rows, carried), mixed_s(rows, carried))
    return budgets


def test_until_a_step_measures_it_the_budget_is_a_cautious_first_guess() -> None:
    costs = StepCosts(2.5)
    assert costs.prompt_budget(CAP) == FIRST_PROMPT_TOKENS  # not the cap: 256 tokens would stall every stream
    costs.observe(_step(8), decode_s(8))
    assert costs.prompt_budget(CAP) == FIRST_PROMPT_TOKENS  # no mixed step yet
    assert costs.prompt_budget(32) == 32


def test_a_budget_learnt_from_a_short_first_step_grows_to_the_limit() -> None:
    costs = StepCosts(2.5)
    costs.observe(_step(8), decode_s(8))
    costs.observe(_step(8, 5), mixed_s(8, 5))  # the first mixed step was a 5-token prompt
    assert costs.prompt_budget(CAP) < limit(8) / 2
    assert abs(run_host(costs, rows=8, steps=80)[-1] - limit(8)) <= 2


def test_the_budget_converges_to_the_largest_chunk_under_the_factor() -> None:
    costs = StepCosts(2.5)
    budgets = run_host(costs, rows=8, steps=80)
    assert abs(budgets[-1] - limit(8)) <= 2, budgets[-10:]
    assert mixed_s(8, budgets[-1]) <= 2.5 * decode_s(8) * 1.03


def test_short_tail_chunks_do_not_shrink_the_budget() -> None:
    """The linear model's failure: a 10-token tail costs 17 ms, 1.7 ms a token, and a budget learnt from
    it would be 24 tokens. Only steps that filled their budget say where the limit is."""
    costs = StepCosts(2.5)
    budgets = run_host(costs, rows=8, steps=120, tail_every=2)
    assert abs(budgets[-1] - limit(8)) <= 2, budgets[-10:]


def test_more_streams_make_room_for_longer_prompt_chunks() -> None:
    costs = StepCosts(2.5)
    few = run_host(costs, rows=8, steps=80)[-1]
    many = run_host(costs, rows=64, steps=80)[-1]
    assert abs(many - limit(64)) <= 3 and many > 3 * few


def test_a_step_over_the_factor_shrinks_the_budget_even_when_short() -> None:
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    before = costs.prompt_budget(CAP)
    costs.observe(_step(8, 20), 3.5 * decode_s(8))  # a 20-token step ran long (the host got slower)
    assert costs.prompt_budget(CAP) < before


def test_prompts_arriving_faster_than_the_budget_lift_it() -> None:
    """8 rows allow ~37 tokens a step, but 256-token prompts arrive every 100 ms (2,560 tokens/s) and a
    step carrying prompt tokens takes up to 70 ms: the queue would only grow, so the budget follows the
    arrivals instead."""
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    assert costs.prompt_budget(CAP) < 40
    for i in range(100):  # ten seconds of them: the whole window
        costs.note_arrival(100.0 + 0.1 * i, 256)
    per_step = 2560 * 2.5 * decode_s(8)  # tokens arriving while a prompt-carrying step runs
    assert costs.prompt_budget(CAP) >= per_step
    assert costs.prompt_budget(64) == 64  # never past the cap
    assert 64 < costs.prompt_budget(64, saturated_cap=2048) < per_step  # saturated: past it, up to 4x a decode step


@pytest.mark.parametrize("seconds", [0.0336, 0.0365])  # as fast as the one decode step measured, or barely slower
def test_a_step_near_the_yardstick_at_most_doubles_what_it_carried(seconds: float) -> None:
    """Logged in the engine (8 bfloat16 streams): the batch grew to 7 rows, one 36 ms decode step of them was
    the whole yardstick, and a full 20-token step then took 33.6 ms; read as free tokens, the budget went
    from 21 to 4,016."""
    costs = StepCosts(2.0)
    costs.observe(_step(1), 0.019)
    costs.observe(_step(1, 64), 0.076)  # learnt ~21
    before = costs.budget
    assert before is not None and before < 25
    costs.observe(_step(7), 0.036)  # another batch: the only sample
    costs.observe(_step(7, 20), seconds)
    assert costs.budget is not None and costs.budget <= 0.8 * before + 0.2 * 20 * 2.0
    assert costs.prompt_budget(CAP) < 2 * before
    if seconds < 0.036:
        assert costs.budget == before  # faster than the decode step: nothing learnt, in either direction


def test_arrivals_past_the_cap_are_admitted_up_to_the_saturated_stall() -> None:
    """512-token prompts every 50 ms (10,240 tokens/s) while 64 streams decode, at stall factor 2 and a
    while-decoding cap of 64: ~2,150 tokens arrive per prompt-carrying step. Held to the cap the queue grows
    for as long as the load lasts; a saturated server admits past it, as many as stall the streams about
    SATURATED_STALL x a decode step (the learnt budget, 84 tokens for 2x, scaled to 4x), not its whole budget."""
    costs = StepCosts(2.0)
    run_host(costs, rows=64, steps=80)
    for i in range(200):
        costs.note_arrival(100.0 + 0.05 * i, 512)
    admitted = costs.prompt_budget(64, saturated_cap=2048)
    assert costs.prompt_budget(64) == 64
    assert admitted == int(int(costs.budget) * (SATURATED_STALL - 1.0))
    assert 3.5 * decode_s(64) < mixed_s(64, admitted) <= SATURATED_STALL * decode_s(64) * 1.05
    assert costs.prompt_budget(64, saturated_cap=128) == 128


def test_old_arrivals_leave_the_window() -> None:
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    for i in range(20):
        costs.note_arrival(0.1 * i, 256)
    costs.note_arrival(60.0, 32)  # a lull: one arrival a minute later
    assert len(costs.arrivals) == 1 and costs.arrival_floor() < MIN_PROMPT_TOKENS


def test_one_long_step_does_not_lift_the_floor() -> None:
    """A step with no stream generating carries every waiting prompt (a second or more): the floor's time
    scale is the decode step, so such a step does not turn the next ten steps into long prompt steps."""
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    for i in range(20):
        costs.note_arrival(0.5 * i, 128)  # 256 tokens/s: ~18 tokens per prompt-carrying step
    before = costs.prompt_budget(CAP)
    costs.observe(_step(0, 1024), 1.3)
    assert costs.prompt_budget(CAP) == before


def test_a_burst_of_arrivals_is_not_read_as_a_rate() -> None:
    """8 requests of 128 tokens in one millisecond (a closed-loop client's start) are 1,024 tokens in the
    window, ~100 tokens/s: not 10^6 tokens/s that would lift every step to the cap and stall every stream."""
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    for i in range(8):
        costs.note_arrival(5.0 + 1e-4 * i, 128)
    assert costs.prompt_budget(CAP) <= limit(8) + 2


def test_without_a_factor_nothing_is_learnt_and_the_cap_holds() -> None:
    costs = StepCosts(0.0)
    run_host(costs, rows=8, steps=20)
    assert costs.budget is None and costs.prompt_budget(64) == 64


def test_a_prompt_only_step_says_nothing_about_the_stall() -> None:
    costs = StepCosts(2.5)
    run_host(costs, rows=8, steps=80)
    budget, decode = costs.budget, costs.decode_step_s
    costs.observe(_step(0, 512), 0.700)
    assert costs.budget == budget and costs.decode_step_s == decode


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 300), st.floats(1e-4, 2.0)), max_size=40),
       st.lists(st.tuples(st.floats(0, 100), st.integers(1, 4000)), max_size=20), st.integers(1, 512))
def test_the_budget_stays_between_the_floor_and_the_cap(
        steps: list[tuple[int, int, float]], arrivals: list[tuple[float, int]], cap: int) -> None:
    costs = StepCosts(2.5)
    for (rows, prompt, seconds), (at, tokens) in zip(steps, arrivals + [(0.0, 1)] * len(steps), strict=False):
        costs.observe(_step(rows, prompt), seconds)
        costs.note_arrival(at, tokens)
        assert min(MIN_PROMPT_TOKENS, cap) <= costs.prompt_budget(cap) <= max(cap, MIN_PROMPT_TOKENS)


def three_streams(**config: object) -> tuple[Scheduler, FakeRunner, Run, list[Request]]:
    """A serving scheduler (stall factor 2, cap 256, 512 tokens a step) whose three 8-token prompts ran
    their prompt step: three streams generating."""
    sched, runner = make_scheduler(num_device_blocks=400, max_num_batched_tokens=512,
                                   max_prefill_tokens_while_decoding=256, prefill_stall_factor=2.0, **config)
    first = [make_request(8, max_tokens=60, ignore_eos=True) for _ in range(3)]
    for r in first:
        sched.add_request(r)
    run = Run()
    step(sched, runner, run)
    return sched, runner, run, first


def test_the_scheduler_spends_the_time_budget_not_only_the_token_cap() -> None:
    sched, runner, run, first = three_streams()
    sched.step_costs.observe(_step(3), 0.040)  # as EngineCore reports its steps
    sched.step_costs.observe(_step(3, 64), 0.120)  # a full step 3x a decode step: 64 x 1 / 2 = 32 fit
    late = make_request(200, max_tokens=5, ignore_eos=True)
    sched.add_request(late)
    lens = {r.request_id: r.num_prompt_tokens for r in [*first, late]}
    out = step(sched, runner, run)
    assert prompt_tokens(out, lens) == 32  # the token cap alone would have let all 200 in


@pytest.mark.parametrize("drain_s, waited, carried", [(0.0, 2.0, 32), (0.5, BACKLOG_AGE_S, 96),
                                                      (0.5, BACKLOG_AGE_S - 0.1, 32), (0.05, BACKLOG_AGE_S, 256)])
def test_a_backlog_drain_time_lifts_the_budget_while_prompts_wait(drain_s: float, waited: float,
                                                                  carried: int) -> None:
    """Two 200-token prompts have waited BACKLOG_AGE_S: drained within 0.5 s of steps like the one seen,
    3 x 40 ms, 400 x 0.12 / 0.5 = 96 tokens a step. Off (the default), or waiting less long (a burst the stall
    bound may yet clear), the learnt 32. Within 0.05 s, 640: held to the cap of 256, since past it (up to
    the step's 512) is allowed only as far as a 4x stall, 3 x the learnt 32 here."""
    clock = FakeClock()
    sched, runner, run, first = three_streams(clock=clock, prefill_backlog_drain_s=drain_s)
    sched.step_costs.observe(_step(3), 0.040)
    sched.step_costs.observe(_step(3, 64), 0.120)  # learnt: 32 tokens a step
    late = [make_request(200, max_tokens=5, ignore_eos=True) for _ in range(2)]
    for r in late:
        sched.add_request(r)
    clock.now += waited
    lens = {r.request_id: r.num_prompt_tokens for r in [*first, *late]}
    assert prompt_tokens(step(sched, runner, run), lens) == carried


def test_the_backlog_floor_is_off_by_default_and_passes_the_cap_only_up_to_its_own() -> None:
    assert StepCosts(2.0).backlog_drain_s == 0.0 == SchedulerConfig().prefill_backlog_drain_s
    costs = StepCosts(2.0, 1.0)
    costs.observe(_step(8), 0.030)
    assert costs.prompt_budget(CAP, backlog_tokens=100) == FIRST_PROMPT_TOKENS  # 100 x 2 x 0.03 = 6: below
    assert costs.prompt_budget(CAP, backlog_tokens=2000) == 120  # 2000 x 2 x 0.03 / 1 s
    assert costs.prompt_budget(CAP, backlog_tokens=10**6) == CAP
    assert costs.prompt_budget(CAP, backlog_tokens=10**5, saturated_cap=2048) == CAP  # 3 x 64 for a 4x stall: less
    assert costs.prompt_budget(CAP, backlog_tokens=0, saturated_cap=2048) == FIRST_PROMPT_TOKENS  # no queue: the cap's rule
    costs.budget = 1000.0  # a host where 1,000 tokens stretch a step only 2x
    assert costs.prompt_budget(CAP, backlog_tokens=10**5, saturated_cap=2048) == 2048  # the step's budget


def test_the_scheduler_reports_each_arrival() -> None:
    sched, _ = make_scheduler(num_device_blocks=400, prefill_stall_factor=2.0)
    for n in (8, 30):
        sched.add_request(make_request(n, max_tokens=4))
    assert [tokens for _, tokens in sched.step_costs.arrivals] == [8, 30]


def test_preempted_decode_steps_do_not_stretch_the_yardstick() -> None:
    """A few decode steps that lost a core (2x) or came first (warm-up) leave the decode step's time at
    what most steps take; a running mean held it 30% high, and mixed steps then took 3x, not 2x."""
    costs = StepCosts(2.0)
    for seconds in [0.090, 0.080] + [0.028, 0.028, 0.056, 0.028, 0.028, 0.060, 0.028] * 2:
        costs.observe(_step(8), seconds)
    assert costs.decode_step_s == pytest.approx(0.028)
    for _ in range(20):  # the batch grows: the yardstick follows within a window
        costs.observe(_step(64), 0.080)
    assert costs.decode_step_s == pytest.approx(0.080)


def test_a_factor_of_one_or_less_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_stall_factor"):
        SchedulerConfig(prefill_stall_factor=1.0)
    with pytest.raises(ValueError, match="prefill_backlog_drain_s"):
        SchedulerConfig(prefill_backlog_drain_s=-1.0)
