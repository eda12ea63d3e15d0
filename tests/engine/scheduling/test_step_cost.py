"""engine/scheduling/step_cost.py: the serving budget in time, from the steps the engine has timed."""

from __future__ import annotations

import pytest

from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.step_cost import MIN_PROMPT_TOKENS, StepCosts
from shared.sampling import SamplingParams
from tests.engine.scheduling.fakes import Run, make_request, make_scheduler, step
from tests.engine.scheduling.test_scheduler_serving_budget import prompt_tokens


def _step(decodes: int, prompt_tokens: int = 0) -> SchedulerOutput:
    params = SamplingParams(max_tokens=4)
    chunks = [ScheduledChunk(f"d{i}", [1], 10, [0], True, params, 1) for i in range(decodes)]
    if prompt_tokens:
        chunks.append(ScheduledChunk("p", [1] * prompt_tokens, 0, [0], False, params, 0))
    return SchedulerOutput(chunks=chunks)


def test_the_budget_keeps_a_mixed_step_under_the_factor_of_a_decode_step() -> None:
    costs = StepCosts()
    assert costs.prompt_budget(2.5, cap=256) == 256  # nothing measured yet: the token cap alone
    costs.observe(_step(8), 0.050)
    assert costs.prompt_budget(2.5, cap=256) == 256  # no mixed step yet
    costs.observe(_step(8, 64), 0.146)  # 64 prompt tokens added 96 ms: 1.5 ms each
    assert costs.prompt_token_s == pytest.approx(0.0015)
    assert costs.prompt_budget(2.5, cap=256) == 50  # 1.5 x 50 ms of room / 1.5 ms a token
    assert costs.prompt_budget(2.5, cap=32) == 32
    assert costs.prompt_budget(1.01, cap=256) == MIN_PROMPT_TOKENS  # a prompt always moves


def test_the_estimates_follow_the_batch_as_it_changes() -> None:
    costs = StepCosts()
    for _ in range(40):
        costs.observe(_step(64), 0.100)  # many streams: decode steps get longer...
    costs.observe(_step(64, 64), 0.196)
    assert costs.decode_step_s == pytest.approx(0.100)
    assert costs.prompt_budget(2.5, cap=256) == 100  # ...and absorb longer prompt chunks
    costs.observe(_step(0, 512), 0.700)  # a prompt-only step says nothing about the stall
    assert costs.prompt_token_s == pytest.approx(0.0015) and costs.decode_step_s == pytest.approx(0.100)


def test_the_scheduler_spends_the_time_budget_not_only_the_token_cap() -> None:
    sched, runner = make_scheduler(num_device_blocks=400, max_num_batched_tokens=512,
                                   max_prefill_tokens_while_decoding=256, prefill_stall_factor=2.0)
    first = [make_request(8, max_tokens=60, ignore_eos=True) for _ in range(3)]
    for r in first:
        sched.add_request(r)
    run = Run()
    step(sched, runner, run)
    sched.step_costs.observe(_step(3), 0.040)  # as EngineCore reports its steps
    sched.step_costs.observe(_step(3, 64), 0.120)  # 1.25 ms a prompt token: 32 fit in 40 ms of room
    late = make_request(200, max_tokens=5, ignore_eos=True)
    sched.add_request(late)
    lens = {r.request_id: r.num_prompt_tokens for r in [*first, late]}
    out = step(sched, runner, run)
    assert prompt_tokens(out, lens) == 32  # the token cap alone would have let all 200 in


def test_a_factor_of_one_or_less_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_stall_factor"):
        SchedulerConfig(prefill_stall_factor=1.0)
