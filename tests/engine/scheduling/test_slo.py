"""engine/scheduling/slo.py: prompts meet a TTFT deadline beside generating streams, within the ITL bounds.

A simulated host with a CPU's affine costs, a large fixed part per prompt chunk as on the Intel Xeon (a mixed
step leaves the fast decode path): a decode step of n rows takes 20 ms + 1 ms x n; p prompt tokens beside it add
20 ms + 0.4 ms x p. At 8 streams a decode step is 28 ms, the stall factor's 2x budget is (28 - 20) / 0.4 = 20
prompt tokens, and a 256-token prompt fed that way takes 13 steps of 56 ms. The scheduler is the engine
process's (its serving defaults); the clock moves by each step's simulated time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from engine.outputs import SchedulerOutput
from engine.request import Request
from engine.scheduling.slo import LIFT_STALL, LONG_STEPS, LONG_WINDOW, SloPlanner, tokens_due
from engine.scheduling.step_builder import WAVE_STEPS
from engine.scheduling.step_cost import StepCosts, affine_fit
from engine.serving.main import (
    SERVING_BACKLOG_DRAIN_S,
    SERVING_ITL_TARGET_MS,
    SERVING_PREFILL_BUDGET,
    SERVING_STALL_FACTOR,
    SERVING_TTFT_TARGET_MS,
)
from tests.engine.scheduling.fakes import FakeClock, Run, make_request, make_scheduler, step
from tests.engine.scheduling.test_step_cost import _step

TTFT_S, ITL_S = SERVING_TTFT_TARGET_MS / 1000, SERVING_ITL_TARGET_MS / 1000


def decode_s(rows: int) -> float:
    return 0.020 + 0.001 * rows


def host_s(out: SchedulerOutput) -> float:
    prompt = sum(len(c.token_ids) for c in out.chunks if len(c.token_ids) > 1)
    rows = len(out.chunks) - sum(len(c.token_ids) > 1 for c in out.chunks)
    return decode_s(rows) + (0.020 + 0.0004 * prompt if prompt else 0.0)


class Sim:
    """The engine's serving scheduler on the simulated host: each step is timed, observed, and moves the clock."""

    def __init__(self, host: Callable[[SchedulerOutput], float] | None = None, **targets: float) -> None:
        self.host = host or host_s
        self.clock = FakeClock()
        config = {"ttft_target_s": TTFT_S, "itl_target_s": ITL_S} | targets
        self.sched, self.runner = make_scheduler(
            num_device_blocks=4000, block_size=16, clock=self.clock, max_num_seqs=64, max_num_batched_tokens=2048,
            max_model_len=4096, max_prefill_tokens_while_decoding=SERVING_PREFILL_BUDGET,
            prefill_stall_factor=SERVING_STALL_FACTOR, prefill_backlog_drain_s=SERVING_BACKLOG_DRAIN_S, **config)
        self.run = Run()
        self.ends: list[float] = []  # the clock at the end of each step
        self.added: dict[str, float] = {}
        self.steps: list[tuple[SchedulerOutput, float, int]] = []  # (schedule, seconds, streams it stalled)

    def add(self, prompt: int, max_tokens: int = 1000) -> Request:
        req = make_request(prompt, max_tokens=max_tokens, ignore_eos=True)
        self.sched.add_request(req)
        self.added[req.request_id] = self.clock.now
        return req

    def step(self) -> SchedulerOutput:
        generating = sum(r.num_output_tokens > 0 for r in self.sched.running)
        out = step(self.sched, self.runner, self.run, check=False)
        seconds = self.host(out)
        self.sched.step_costs.observe(out, seconds)
        self.clock.now += seconds
        self.ends.append(self.clock.now)
        self.steps.append((out, seconds, generating))
        return out

    def ttft(self, req: Request) -> float | None:
        first = self.run.results.get((req.request_id, 0))
        if first is None or first.first_step is None:
            return None
        return self.ends[first.first_step - 1] - self.added[req.request_id]

    def streams(self, n: int, warm_steps: int = 60) -> None:
        """n streams generating, with the step costs learnt (a few short prompts passed beside them)."""
        for _ in range(n):
            self.add(16)
        for i in range(warm_steps):
            if i % 15 == 5:
                self.add(64, max_tokens=4)
            self.step()

    def stalls(self) -> list[float]:
        """Seconds of the steps that carried prompt tokens while streams generated."""
        return [s for out, s, gen in self.steps if gen and any(len(c.token_ids) > 1 for c in out.chunks)]


def test_a_lone_prompt_beside_streams_runs_in_the_very_next_step_and_meets_its_deadline() -> None:
    sim = Sim()
    sim.streams(8)
    lone = sim.add(256, max_tokens=4)
    out = sim.step()
    assert lone.request_id in {c.request_id for c in out.chunks}  # no timer, no queue: the next step
    while sim.ttft(lone) is None:
        sim.step()
    ttft = sim.ttft(lone)
    assert ttft is not None and ttft <= TTFT_S + 0.06, ttft  # the deadline, within a step's slack


def test_without_a_ttft_target_the_stall_budget_alone_keeps_the_prompt_waiting() -> None:
    """The behaviour issue 41 measured: 20-token chunks, each paying the chunk's fixed part again."""
    sim = Sim(ttft_target_s=0.0)
    sim.streams(8)
    lone = sim.add(256, max_tokens=4)
    while sim.ttft(lone) is None:
        sim.step()
    ttft = sim.ttft(lone)
    assert ttft is not None and ttft > 2 * TTFT_S


@pytest.mark.parametrize("itl_s", [0.15, 0.1])
def test_a_long_prompt_is_chunked_so_no_step_passes_the_itl_target(itl_s: float) -> None:
    """3,000 prompt tokens cannot meet the deadline: the ITL target wins. The backlog floor, once the prompt has
    waited a second, would plan 256-token steps of 150 ms: held to the target too."""
    sim = Sim(itl_target_s=itl_s)
    sim.streams(8)
    long = sim.add(3000, max_tokens=4)
    sim.steps.clear()
    while sim.ttft(long) is None:
        sim.step()
    stalls = sim.stalls()
    assert len(stalls) >= 10  # chunked: the deadline cannot be met, so the ITL bound wins
    assert max(stalls) <= itl_s * 1.01, max(stalls)  # the deadline and the queue's floors alike


def test_under_continuous_load_a_prompt_never_waits_more_than_a_few_steps() -> None:
    """16 streams, and a 128-token prompt every 4 steps for 300 steps (about what 2 requests/s of 256-token
    prompts ask of the Xeon): each prompt's first chunk runs within 3 steps of its arrival and its first token
    comes within the deadline and a step."""
    sim = Sim()
    sim.streams(16)
    prompts, waits = [], []
    for i in range(300):
        if i % 4 == 0:
            prompts.append((sim.add(128, max_tokens=20), len(sim.steps)))
        sim.step()
    for req, at in prompts[:-2]:
        first = next(k for k, (out, _, _) in enumerate(sim.steps) if k >= at and
                     req.request_id in {c.request_id for c in out.chunks})
        waits.append(first - at)
        ttft = sim.ttft(req)
        assert ttft is not None and ttft <= TTFT_S + 0.1, (req.request_id, ttft)
    assert max(waits) <= 3, waits


def test_the_deadline_plan_is_earliest_deadline_first() -> None:
    # One prompt of 100 tokens due in 0.5 s; steps of 0.05 s + 1 ms a token: (0.5 - 0.1) / 0.05 = 8 steps.
    assert tokens_due([(0.5, 100)], 0.0, 0.05, 0.001) == 13
    # A second, due by 0.3 s: 300 tokens take 0.3 s alone, so everything due by then goes in one step.
    assert tokens_due([(0.5, 100), (0.3, 200)], 0.0, 0.05, 0.001) == 200
    assert tokens_due([(1.25, 256)], 0.0, 1 / 16, 1 / 1024) == 16  # (1.25 - 0.25) x 16 = 16 steps
    assert tokens_due([(0.1, 50)], 1.0, 0.05, 0.001) == 50  # already late: all of it now


def test_past_the_routine_bound_only_a_few_steps_in_the_window() -> None:
    costs = StepCosts(2.0)
    costs.observe(_step(8), 0.028)
    for p in (40, 80, 160, 20):
        costs.observe(_step(8, p), 0.028 + 0.020 + 0.0004 * p)
    slo = SloPlanner(ttft_target_s=0.15, itl_target_s=0.15, stall_limit=LIFT_STALL)
    burst = [(0.15, 256), (0.16, 256), (0.17, 256)]
    given = [slo.prompt_tokens(costs, burst, 0.0, 20, 2048) for _ in range(LONG_WINDOW + 2)]
    longest = (0.15 - 0.048) / 0.0004  # 255 tokens: a step of the ITL target
    routine = (LIFT_STALL * 0.028 - 0.048) / 0.0004  # 72.5: a step of 2.75 decode steps
    assert all(abs(n - longest) <= 1 for n in given[:LONG_STEPS]), given[:LONG_STEPS]
    assert all(abs(n - routine) <= 1 for n in given[LONG_STEPS:LONG_WINDOW + 1])
    assert abs(given[LONG_WINDOW + 1] - longest) <= 1  # the first long step has left the window
    assert abs(SloPlanner(0.15, 0.0, LIFT_STALL).prompt_tokens(costs, burst, 0.0, 20, 2048) - routine) <= 1
    off = SloPlanner(ttft_target_s=0.15, itl_target_s=0.15)  # the default: no routine bound, every step may lift
    assert all(abs(off.prompt_tokens(costs, burst, 0.0, 20, 2048) - longest) <= 1 for _ in range(LONG_WINDOW + 2))


def test_the_prompt_cost_line_separates_the_fixed_part() -> None:
    fixed, per_token = affine_fit([(p, 0.020 + 0.0004 * p) for p in (20, 64, 128, 256)])
    assert fixed == pytest.approx(0.020) and per_token == pytest.approx(0.0004)
    fixed, per_token = affine_fit([(64, 0.0456)] * 5)  # one size: no line, all of it per token
    assert fixed == 0.0 and per_token == pytest.approx(0.0456 / 64)


def test_targets_come_from_the_engine_flags() -> None:
    from engine.serving.core_factory import engine_config
    from engine.serving.main import build_parser

    config = engine_config(build_parser({}).parse_args([])).scheduler
    assert (config.ttft_target_s, config.itl_target_s) == (TTFT_S, ITL_S)
    config = engine_config(build_parser({}).parse_args(["--ttft-target-ms", "0", "--itl-target-ms", "90"])).scheduler
    assert (config.ttft_target_s, config.itl_target_s) == (0.0, 0.09)
    with pytest.raises(ValueError, match="ttft_target_s"):
        engine_config(build_parser({}).parse_args(["--ttft-target-ms", "-1"]))


def test_a_model_whose_decode_step_passes_the_itl_target_still_moves_prompts() -> None:
    """A 1B model: 200 ms decode steps, where 150 ms cannot be kept. Deadlines then lift to the stall factor's
    own step (2x), and the queue's floors keep their bound: prompts do not crawl at MIN_PROMPT_TOKENS."""
    costs = StepCosts(2.0)
    costs.observe(_step(16), 0.200)
    for p in (64, 128, 256, 32):
        costs.observe(_step(16, p), 0.200 + 0.030 + 0.002 * p)
    slo = SloPlanner(ttft_target_s=0.15, itl_target_s=0.15)
    late = [(0.0, 512)]
    assert abs(slo.prompt_tokens(costs, late, 1.0, 40, 2048) - (0.4 - 0.23) / 0.002) <= 1  # 85: a 2x step
    assert slo.prompt_tokens(costs, [], 1.0, 300, 2048) == 300  # a floor past the target keeps its own bound
    kept = SloPlanner(ttft_target_s=0.15, itl_target_s=0.5)  # a target this model can keep bounds the floors
    assert abs(kept.prompt_tokens(costs, [], 1.0, 300, 2048) - (0.5 - 0.23) / 0.002) <= 1


def test_a_noisy_shallow_slope_is_not_read_as_cheap_tokens() -> None:
    """Steps of 20-64 tokens, the short ones slowed by a neighbour: a line through them would say 0.01 ms a
    token, and a step planned on it would carry thousands."""
    samples = [(20, 0.040), (24, 0.041), (60, 0.041), (64, 0.0415)]
    fixed, per_token = affine_fit(samples)
    assert fixed == 0.0 and per_token == pytest.approx(sum(x for _, x in samples) / sum(p for p, _ in samples))


def test_the_itl_target_alone_bounds_the_floors() -> None:
    """No TTFT target: nothing is lifted, but the backlog floor still keeps to the ITL target."""
    sim = Sim(ttft_target_s=0.0, itl_target_s=0.1)
    sim.streams(8)
    sim.add(3000, max_tokens=4)
    sim.steps.clear()
    for _ in range(60):
        sim.step()
    assert max(sim.stalls()) <= 0.1 * 1.01


def test_a_prompt_waits_for_streams_that_all_end_within_a_few_steps() -> None:
    """Streams that all end within WAVE_STEPS tokens are not stalled: the prompt waits for them (a few decode
    steps), then runs beside nothing. One stream with more to go and the prompt runs in the next step."""
    sim = Sim()
    sim.streams(8)
    for r in sim.sched.running:  # every stream's end comes within WAVE_STEPS tokens
        r.sampling = dataclasses.replace(r.sampling, max_tokens=r.num_output_tokens + WAVE_STEPS)
    lone = sim.add(256, max_tokens=4)
    carried = [lone.request_id in {c.request_id for c in sim.step().chunks} for _ in range(WAVE_STEPS + 1)]
    assert carried == [False] * WAVE_STEPS + [True], carried
    assert all(gen == 0 for out, _, gen in sim.steps[-1:])  # it ran beside no generating stream

    sim = Sim()
    sim.streams(8)
    for r in sim.sched.running[1:]:
        r.sampling = dataclasses.replace(r.sampling, max_tokens=r.num_output_tokens + 2)
    lone = sim.add(256, max_tokens=4)
    assert lone.request_id in {c.request_id for c in sim.step().chunks}
