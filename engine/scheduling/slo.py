"""The serving targets: a prompt's first token within ttft_target_s, no stream's gap past the ITL bounds.

Decided here, once a step while streams generate: how many prompt tokens the step must carry so that every
waiting prompt can still see its first token by its deadline (queued at + ttft_target_s), and how many it may
carry before the streams' inter-token gap passes the bounds. StepCosts (step_cost.py) says what steps cost;
step_builder.serving_prefill_budget gives a step the larger of this and the stall-factor budget.

    due        (deadline, prompt tokens left) of every prompt that has no token yet, earliest first
    step(p)    decode + fixed + per_token x p: a step carrying p prompt tokens (StepCosts.prompt_cost)
    R_j        prompt tokens due by the j-th deadline;   k_j = steps that fit before it, at least 1:
               floor((deadline_j - now - per_token x R_j) / (decode + fixed))
    need       max over j of ceil(R_j / k_j): the fewest tokens a step carries if every deadline is met

Why a deadline and not a waiting timer: the stall-factor budget (2x a decode step) fed a 256-token prompt
through 5-12 small steps, each paying the fixed part again, and a Poisson burst waited for the backlog floor,
which counts prompts only once they have waited a second (step_cost.BACKLOG_AGE_S): median TTFT 285 ms and
p99 1,125 ms against vLLM's 222 and 385 at 2 requests/s (Intel Xeon, bfloat16), on a half-idle machine.

When both targets cannot be met the ITL bound wins, and the prompt comes late with the most each step may
carry:
  default   a deadline lifts a step up to itl_target_s (the engine's default: 1 s), so at light load a prompt
            goes whole into one step and under overload the queue drains in long steps, as vLLM's does.
            Streams that are all about to end are not stalled at all (step_builder.wave_ends_soon)
  routine   with stall_limit (--ttft-stall-limit, e.g. LIFT_STALL) a lifted step routinely stalls the streams
            at most stall_limit x a decode step (and never past itl_target_s unless the stall factor's own
            step, 2x a decode step, is longer: a big model); smoother streams, later first tokens
  bursts    then at most LONG_STEPS of the last LONG_WINDOW steps may go past the routine bound, up to
            itl_target_s: a burst of prompts drains at nearly whole-prompt speed, and steps that long stay
            well under 1% of the streams' gaps, so out of their p99
  floors    the queue's floors (arrival, backlog: step_cost.py) never plan a step past itl_target_s either,
            on a host and model that can keep it (the stall factor's step is shorter); where even that
            passes the target (a big model), the floors keep their own bound (SATURATED_STALL), so
            prompts always move
Pure Python: no clock of its own (the scheduler passes `now`), no torch.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from engine.scheduling.step_cost import MIN_PROMPT_TOKENS, StepCosts

LIFT_STALL = 2.75
"""A --ttft-stall-limit for smooth streams: a lifted step takes at most this many decode steps, routinely, under a
3x p99/p50 gap with a margin for the cost estimate's error (the default before whole-prompt lifts: at 2 requests/s
a 256-token prompt then took 4-5 steps, TTFT p50 388-446 ms against 195-204 with whole prompts, Zen 4)."""
LONG_WINDOW = 512
"""Steps beside generating streams over which LONG_STEPS are counted."""
LONG_STEPS = 4
"""Steps of the last LONG_WINDOW that may go past the routine bound (up to itl_target_s) for a burst: under 1%
of the steps (0.8%), so of the gaps of the streams they stall: out of the p99 with room for a noisy host."""


def tokens_due(due: list[tuple[float, int]], now: float, step_s: float, per_token_s: float) -> int:
    """The fewest prompt tokens per step that finish every prompt's prefill by its deadline, earliest deadline
    first: `due` holds (deadline, tokens left); a step takes step_s plus per_token_s a prompt token. A deadline
    that cannot be met asks for everything due by it in one step."""
    need, total = 0, 0
    for deadline, tokens in sorted(due):
        total += tokens
        steps = max(1, int((deadline - now - per_token_s * total) // step_s))
        need = max(need, -(-total // steps))
    return need


@dataclass
class SloPlanner:
    ttft_target_s: float = 0.0
    """A prompt's first token is due this long after it was queued (0: no deadlines, nothing planned)."""
    itl_target_s: float = 0.0
    """The longest step the floors or a deadline may plan (0: no bound on the floors, no long steps)."""
    stall_limit: float = 0.0
    """A step lifted for a deadline routinely takes at most this many decode steps (--ttft-stall-limit; 0: no
    routine bound, deadlines lift steps up to itl_target_s)."""
    planned: deque[bool] = field(default_factory=lambda: deque(maxlen=LONG_WINDOW))
    """Whether each of the latest steps beside generating streams went past the routine bound."""

    def prompt_tokens(self, costs: StepCosts, due: list[tuple[float, int]], now: float, floor: int,
                      cap: int) -> int:
        """Prompt tokens for the next step while streams generate: `floor` (the stall-factor budget and the
        queue's floors, step_cost.py) held to the ITL target, then lifted as far as the deadlines in `due`
        need, within the bounds above and `cap` (the step's token budget)."""
        tokens, long = self._plan(costs, due, now, floor)
        self.planned.append(long)
        return min(tokens, max(cap, floor))

    def _plan(self, costs: StepCosts, due: list[tuple[float, int]], now: float, floor: int) -> tuple[int, bool]:
        """(tokens, whether a deadline took the step past the routine bound)."""
        cost, decode_s = costs.prompt_cost(), costs.decode_step_s
        if cost is None or decode_s is None:
            return floor, False  # nothing measured yet: the stall factor's first guess rules

        def fitting(seconds: float) -> int:
            return max(MIN_PROMPT_TOKENS, int((seconds - decode_s - fixed) // per_token))

        fixed, per_token = cost
        routine_s = self.stall_limit * decode_s if self.stall_limit else math.inf  # off: up to the target
        if self.itl_target_s:  # the target binds unless a big model's stall-factor step alone passes it
            routine_s = min(routine_s, max(self.itl_target_s, costs.stall_factor * decode_s))
        routine = fitting(routine_s) if routine_s < math.inf else 1 << 30  # no bound at all: the whole due
        longest = max(routine, fitting(self.itl_target_s))
        if self.itl_target_s >= costs.stall_factor * decode_s:  # a target this host can keep bounds the floors too
            floor = min(floor, longest)
        need = tokens_due(due, now, decode_s + fixed, per_token) if self.ttft_target_s and due else 0
        if need <= floor:
            return floor, False
        if need <= routine or longest == routine or sum(self.planned) >= LONG_STEPS:
            return max(floor, min(need, routine)), False
        return max(floor, min(need, longest)), True
