"""engine/scheduling/step_cost.py: the decode yardstick follows the batch, and arrivals are read at their rate.

While prompts keep arriving every step carries some, so a batch that grows from 10 to 64 streams is never
seen decoding alone; the serving mode then spends one step without prompt tokens to measure it again. The
floors that keep a queue from growing count time in steps as long as prompt-carrying steps took lately.
"""

from __future__ import annotations

import pytest

from engine.scheduling.step_cost import ARRIVAL_MARGIN, SATURATED_STALL, STALE_AFTER_STEPS, StepCosts
from tests.engine.scheduling.fakes import make_request, step
from tests.engine.scheduling.test_scheduler_serving_budget import prompt_tokens
from tests.engine.scheduling.test_step_cost import _step, decode_s, mixed_s, three_streams


def grown(costs: StepCosts, mixed_steps: int) -> StepCosts:
    """Decode steps of 10 rows measured, then `mixed_steps` steps carrying prompt tokens."""
    for _ in range(5):
        costs.observe(_step(10), decode_s(10))
    for _ in range(mixed_steps):
        costs.observe(_step(10, 40), mixed_s(10, 40))
    return costs


def test_a_batch_unlike_the_measured_one_makes_the_yardstick_stale() -> None:
    costs = grown(StepCosts(2.0), STALE_AFTER_STEPS)
    assert costs.stale(64) and costs.stale(4)  # 6 rows fewer: more than 4 apart
    assert not costs.stale(12) and not costs.stale(14)  # within 4 rows (25% of 10 is less)


def test_the_yardstick_is_not_remeasured_too_often_nor_without_a_budget() -> None:
    assert not grown(StepCosts(2.0), STALE_AFTER_STEPS - 1).stale(64)  # a decode step ran lately
    assert not grown(StepCosts(0.0), 20).stale(64)  # no time budget: nothing to measure it for
    assert not StepCosts(2.0).stale(64)  # nothing measured yet: FIRST_PROMPT_TOKENS rules


def test_a_decode_step_of_another_batch_replaces_the_old_measurements() -> None:
    costs = grown(StepCosts(2.0), STALE_AFTER_STEPS)
    assert costs.decode_step_s == pytest.approx(decode_s(10))
    costs.observe(_step(64), decode_s(64))
    assert costs.decode_step_s == pytest.approx(decode_s(64))  # not the median of five 10-row steps and one
    assert not costs.stale(64)
    costs.observe(_step(66), decode_s(66))  # the same batch, give or take: measurements accumulate
    assert costs.decode_step_s == pytest.approx((decode_s(64) + decode_s(66)) / 2)


def test_the_scheduler_runs_one_decode_only_step_when_the_yardstick_is_stale() -> None:
    sched, runner, run, first = three_streams()
    for _ in range(3):  # measured at 20 rows, then only mixed steps: 3 streams now are another batch
        sched.step_costs.observe(_step(20), 0.040)
    for _ in range(STALE_AFTER_STEPS):
        sched.step_costs.observe(_step(20, 32), 0.080)
    late = make_request(200, max_tokens=5, ignore_eos=True)
    sched.add_request(late)
    lens = {r.request_id: r.num_prompt_tokens for r in [*first, late]}
    out = step(sched, runner, run)
    assert prompt_tokens(out, lens) == 0 and len(out.chunks) == 3  # the three streams decode alone
    sched.step_costs.observe(out, 0.030)  # as EngineCore reports it: the yardstick of 3 rows
    assert prompt_tokens(step(sched, runner, run), lens) > 0  # and the prompt moves on the next step


def test_a_load_that_began_seconds_ago_is_read_at_its_rate() -> None:
    """Two seconds of 8 requests/s of 256 tokens: 2,048 tokens/s, read as at least half that (the
    shortest time base is 4 s), not as a fifth (the whole 10 s window)."""
    costs = StepCosts(2.0)
    costs.observe(_step(10), decode_s(10))
    for i in range(16):
        costs.note_arrival(100.0 + 0.125 * i, 256)
    per_step = 2.0 * decode_s(10) * ARRIVAL_MARGIN
    assert costs.arrival_floor() >= int(16 * 256 / 4.0 * per_step)
    assert costs.arrival_floor() <= int(16 * 256 / 1.875 * per_step)


@pytest.mark.parametrize("stall, counted", [(None, 2.0), (1.5, 2.0), (3.0, 3.0), (6.0, SATURATED_STALL)])
def test_the_floors_count_steps_as_long_as_prompt_steps_took(stall: float | None, counted: float) -> None:
    """Arrivals of 1,024 tokens/s, prompt-carrying steps of `stall` x a 30 ms decode step: a floor that
    assumed the stall factor's 60 ms while steps took 90 admitted two thirds of what arrived, and the queue
    grew until the backlog floor took prompts a second old. Never below the factor (a short step says the
    budget has room, not that fewer tokens arrive), never past SATURATED_STALL."""
    costs = StepCosts(2.0, backlog_drain_s=0.5)
    costs.observe(_step(10), 0.030)
    for _ in range(3 if stall else 0):
        costs.observe(_step(10, 100), 0.030 * stall)
    for i in range(16):
        costs.note_arrival(100.0 + 0.125 * i, 256)  # over 2 s, read over the 4 s shortest base
    step_s = 0.030 * counted
    assert costs.prompt_step_s == pytest.approx(step_s)
    assert costs.arrival_floor() == int(16 * 256 / 4.0 * step_s * ARRIVAL_MARGIN)
    assert costs.backlog_floor(1000) == int(1000 * step_s / 0.5)
