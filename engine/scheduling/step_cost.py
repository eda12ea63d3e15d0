"""What a step costs on this host, learnt from the steps the engine runs: the serving mode's time budget.

A prompt step stalls every generating stream for its whole length. A fixed token budget
bounds that stall differently on every host and load (64 prompt tokens stretched a decode
step 2.7x on an AVX-512 Xeon, 3.1x on a Zen 4 EPYC at 8 streams; with 64 streams the same
64 tokens barely show). So the engine times its own steps (EngineCore feeds `observe`) and
`prompt_budget(cap)` admits as many prompt tokens as keep a step that carries
them under stall_factor x a decode-only step:

    decode_step_s   a decode-only step as the batch runs now (the median of the last DECODE_WINDOW):
                    more streams, longer steps, more room for prompt tokens beside them. While prompts keep
                    arriving every step carries some, so no decode-only step is seen while the batch grows:
                    once the batch is unlike the one measured (`stale`), the serving mode runs one step
                    without prompt tokens to measure it again (engine/scheduling/step_builder.py)
    budget          prompt tokens a step may carry, learnt by feedback: after a step that used
                    (nearly) its whole budget, or overran the factor anyway, scale what it carried
                    by (F - 1) / (its stall - 1), where stall = its seconds / decode_step_s
    arrivals        prompt tokens arriving per second (the last ARRIVAL_WINDOW_S of arrivals):
                    the budget never drops below what arrives per step, or the queue only grows
    backlog         prompt tokens queued or part-prefilled for BACKLOG_AGE_S or more (the scheduler's
                    count): with backlog_drain_s set, the budget admits enough that they drain within about that
                    long, past the cap (which bounds the stall of a server that keeps up) up to the step's token
                    budget and SATURATED_STALL: TTFT and throughput under load bought with longer steps (off here; the
                    engine process sets SERVING_BACKLOG_DRAIN_S: engine/serving/main.py says why)

Why feedback and not a cost model: a step's extra time is affine in its prompt tokens (a
chunk's attention call and new product shapes cost something whatever its length). The
linear model this replaced charged that fixed part to each token of the short tail chunks,
so its per-token estimate grew and its budget shrank itself (median TTFT 5.5 s against
0.52 s over HTTP at 2 requests/s). Learning only from steps that filled the budget (or
overran) needs no model of the fixed part: its fixed point is where a full step takes F
decode steps, and tail chunks, which say nothing about the limit, are ignored.
Pure Python: no clock of its own (the scheduler's, for arrivals; EngineCore's, for steps), no torch.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from engine.outputs import SchedulerOutput

SMOOTHING = 0.2
"""Weight of the newest step in the learnt budget: about the last ten full steps count."""
DECODE_WINDOW = 15
"""Decode-only steps whose median is the decode step's time. A median, not a running mean: decode
steps that the gateway or a client preempted (up to 2x on 2 cores) and the warm-up's first steps held
a mean at 37 ms where the median decode step took 28 ms, and every mixed step was then allowed about
3x a real decode step, not 2x (Zen 4, 8 streams, logged inside the engine)."""
MIN_PROMPT_TOKENS = 16
"""A step that carries prompt tokens at all carries at least this many (a prompt always moves)."""
FIRST_PROMPT_TOKENS = 64
"""The budget until a step has measured it: what stretched a decode step about 3x on the hosts measured
(starting from the cap instead stalled every stream for a whole 256-token step before anything was learnt)."""
MAX_GROWTH = 2.0
"""A step says at most this many times its prompt tokens fit: near a stall of 1 the feedback's extrapolation
(F - 1) / (stall - 1) says nothing. Unbounded, a 20-token step that took 33.6 ms against a yardstick of one
36 ms decode step (the batch had just grown) set the budget from 21 to 4,016 tokens; the cap's 256-token steps
then stalled 8 bfloat16 streams ~4.5x a decode step for ten steps, and p99/p50 ITL read 4.0x (Intel Xeon)."""
FULL_STEP = 0.75
"""A step carrying at least this share of its budget says where the limit is; shorter ones do not."""
ARRIVAL_WINDOW_S = 10.0
"""Arrivals this recent (before the newest one) make the arrival rate."""
ARRIVAL_MIN_SPAN_S = 4.0
"""The arrival rate's shortest time base. Over the whole window instead, the rate of a load that began a few
seconds ago read as a fraction of itself: at 8 requests/s of 256-token prompts, 20-60 tokens a step for the
first seconds where ~160 arrived, and the queue grew until the backlog floor drained it."""
BACKLOG_AGE_S = 1.0
"""A prompt counts toward the backlog floor once it has waited this long (engine/scheduling/step_builder.py):
a burst the stall bound clears sooner is left to it. Counting every waiting prompt, 8 closed-loop float32
streams (128-token prompts) had p99/p50 ITL 2.13-2.93x against 1.93-2.42x without the floor (Zen 4); from 1 s
on, 1.85-2.27x in five runs of six. 0.5 s, with the floor lifted past the cap (Intel Xeon with AMX, 8 streams,
`bench serve --random 32 128 64 --concurrency 8`): float32 p99/p50 2.35x, 2.39x (1 s: 2.08x), bfloat16 2.2-2.4x;
at 8 requests/s of 256-token prompts median TTFT 845 ms against 1,754 ms with 1 s and the cap. Back to 1 s once
the arrival floor passed the cap and the decode yardstick followed the batch (both of which took over the
overload's queue): on the same host kind, a noisier day, float32 8 streams 2.98x, 4.26x, 3.19x, 3.30x at 0.5 s
against 2.40x, 2.25x at 1 s; 8 requests/s median TTFT 1.02-1.07 s at 0.5 s, 1.18-1.41 s at 1 s."""
STALE_SHARE = 0.25
"""The decode steps measured lately stop describing the batch once its decode rows differ from theirs by more
than this share (and STALE_ROWS): at 8 requests/s of 256-token prompts (Intel Xeon with AMX) the yardstick
stayed at the 30 ms of a 10-row step while the batch grew to 64 rows (80 ms steps), so every mixed step read
as a 3-6x stall, the learnt budget fell to ~60 tokens, and prompts waited for the backlog floor (median TTFT
1.1-1.2 s)."""
STALE_ROWS = 4
"""Fewer rows apart than this never make the yardstick stale (8 closed-loop streams move between 7 and 8)."""
STALE_AFTER_STEPS = 4
"""Steps since the last decode-only one before the yardstick may be called stale again: at most one step in
five is spent re-measuring, whatever a batch does."""
SATURATED_STALL = 4.0
"""The longest a step that drains a saturated server's queue may stall its streams, in decode steps. Up to the
step's whole token budget instead, drains of 700-1,700 prompt tokens took 0.3-0.6 s beside 64 streams
(8 requests/s of 256-token prompts, Intel Xeon with AMX): p99 inter-token latency 526 ms against vLLM's 499 in
the same sitting."""
ARRIVAL_MARGIN = 1.25
"""The arrival floor admits this much more than arrives per step, so a backlog drains."""
PROMPT_COST_WINDOW = 32
"""Steps carrying prompt tokens beside decodes whose extra seconds make the affine prompt cost (prompt_cost)."""
MIN_SLOPE_SHARE = 0.25
"""A fitted per-token cost under this share of the through-origin one is noise (steps slowed by a neighbour on a
shared host), not cheap tokens: planned on, it would fill a step with thousands of tokens; through the origin
instead."""


@dataclass
class StepCosts:
    stall_factor: float = 0.0
    """F: a step carrying prompt tokens beside decodes may take F x a decode-only step (0: no
    time budget; the token cap alone, and nothing is learnt)."""
    backlog_drain_s: float = 0.0
    """Seconds within which a backlog of prompt tokens should drain (0: no backlog floor). The arrival
    floor alone runs prefill at about 80% utilisation, where Poisson bursts queue for seconds: median
    TTFT 1.0-2.7 s at 2 requests/s of 256-token prompts on the Zen 4 (vLLM's 0.39 s); 1 s halved it there,
    at the price of steps up to the cap while a burst drains (p99 ITL 164-212 ms against 100-135)."""
    decode_times: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=DECODE_WINDOW))
    """(seconds, decode rows) of the latest decode-only steps of a batch like the current one, oldest first."""
    steps_since_decode: int = 0
    """Steps run since the latest decode-only step."""
    budget: float | None = None
    """Prompt tokens a step may carry beside decodes (None: no full mixed step seen yet)."""
    arrivals: deque[tuple[float, int]] = field(default_factory=deque)
    """(arrival time, prompt tokens) of recent requests, oldest first."""
    prompt_stalls: deque[float] = field(default_factory=lambda: deque(maxlen=DECODE_WINDOW))
    """Seconds over the decode step's of the latest steps that carried prompt tokens beside decodes."""
    prompt_extra: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=PROMPT_COST_WINDOW))
    """(prompt tokens, seconds beyond the decode step) of the latest steps that carried prompt tokens beside decodes."""

    def observe(self, out: SchedulerOutput, seconds: float) -> None:
        """One executed step: its schedule and how long the runner took."""
        if not out.chunks or seconds <= 0:
            return
        prompt_chunks = [len(c.token_ids) for c in out.chunks if len(c.token_ids) > 1]
        prompt_tokens, decodes = sum(prompt_chunks), len(out.chunks) - len(prompt_chunks)
        self.steps_since_decode += 1
        if prompt_tokens == 0:
            if self.decode_times and self._unlike(decodes):
                self.decode_times.clear()  # another batch: the old steps no longer describe it
            self.decode_times.append((seconds, decodes))
            self.steps_since_decode = 0
        elif decodes and (decode_s := self.decode_step_s) is not None and self.stall_factor > 1.0:
            self.prompt_stalls.append(seconds / decode_s)
            self.prompt_extra.append((prompt_tokens, seconds - decode_s))
            self._learn(prompt_tokens, seconds / decode_s)

    @property
    def decode_step_s(self) -> float | None:
        """Seconds of a decode-only step lately (None: none seen yet)."""
        return statistics.median(s for s, _ in self.decode_times) if self.decode_times else None

    @property
    def prompt_step_s(self) -> float | None:
        """Seconds a step carrying prompt tokens takes lately: what the floors divide time by. The stall
        factor's step until such steps were seen; never less than that, nor more than SATURATED_STALL's.
        Counted at the factor alone, the arrival floor admitted 2,048 arriving tokens a second in steps
        that took longer than it assumed, so the queue grew until the backlog floor took prompts a second
        old (8 requests/s of 256-token prompts, Intel Xeon with AMX: median TTFT 1.4 s)."""
        if self.decode_step_s is None:
            return None
        stall = statistics.median(self.prompt_stalls) if self.prompt_stalls else self.stall_factor
        return self.decode_step_s * min(max(stall, self.stall_factor), SATURATED_STALL)

    def prompt_cost(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token) that prompt tokens add to a decode step, the line fitted to the
        latest mixed steps: a chunk's attention call and new product shapes cost something whatever its length,
        so the deadline plan (engine/scheduling/slo.py) charges that part once per step, not per token. Steps of
        one size (or a fit that slopes down) give no line: then the whole extra time is charged per token, which
        overstates a bigger chunk's cost (safe for the ITL bound, early for the TTFT). Before any mixed step:
        the learnt budget's (or the first guess's) tokens for the stall factor's extra time. None: no decode
        step measured, or no time budget."""
        decode_s = self.decode_step_s
        if decode_s is None or self.stall_factor <= 1.0:
            return None
        samples = [(p, max(x, 0.0)) for p, x in self.prompt_extra]
        if not samples:
            tokens = FIRST_PROMPT_TOKENS if self.budget is None else max(self.budget, float(MIN_PROMPT_TOKENS))
            return 0.0, (self.stall_factor - 1.0) * decode_s / tokens
        return affine_fit(samples)

    def stale(self, decode_rows: int) -> bool:
        """Whether a batch of `decode_rows` generating streams needs a decode-only step to measure it: the
        steps measured were of a batch unlike it (STALE_SHARE), and none was run in the last
        STALE_AFTER_STEPS steps. False before any was measured, or without a time budget."""
        return (self.stall_factor > 1.0 and bool(self.decode_times) and self.steps_since_decode >= STALE_AFTER_STEPS
                and self._unlike(decode_rows))

    def _unlike(self, decode_rows: int) -> bool:
        measured = statistics.median(rows for _, rows in self.decode_times)
        return abs(decode_rows - measured) > max(STALE_ROWS, STALE_SHARE * measured)

    def _learn(self, prompt_tokens: int, stall: float) -> None:
        full = self.budget is None or prompt_tokens >= FULL_STEP * self.budget
        if not (full or stall > self.stall_factor):
            return  # a tail chunk under the limit: its fixed cost would read as a high per-token cost
        if stall <= 1.0:
            return  # no slower than a decode step: the yardstick is off (one noisy sample), not prompts free
        target = min(prompt_tokens * (self.stall_factor - 1.0) / (stall - 1.0), prompt_tokens * MAX_GROWTH)
        self.budget = _blend(self.budget, max(float(MIN_PROMPT_TOKENS), target))

    def note_arrival(self, now: float, prompt_tokens: int) -> None:
        """A request was queued at `now` (the scheduler's clock): its prompt must fit into coming steps."""
        self.arrivals.append((now, prompt_tokens))
        while self.arrivals[0][0] < now - ARRIVAL_WINDOW_S:
            self.arrivals.popleft()

    def arrival_floor(self) -> int:
        """Prompt tokens arriving per prompt-carrying step lately (such a step takes prompt_step_s), with a
        margin. The rate is the window's tokens over the time they span, at least ARRIVAL_MIN_SPAN_S: a burst
        (8 requests in one millisecond) is spread over that, not read as thousands of tokens a second that
        would lift every step to the cap. Steps beside decodes set the time scale, not the mean step: one
        unbounded prompt step (no stream generating) would otherwise inflate the floor for ten steps."""
        step_s = self.prompt_step_s
        if step_s is None or not self.arrivals:
            return 0
        span = max(ARRIVAL_MIN_SPAN_S, self.arrivals[-1][0] - self.arrivals[0][0])
        tokens_per_s = sum(n for _, n in self.arrivals) / span
        return int(tokens_per_s * step_s * ARRIVAL_MARGIN)

    def backlog_floor(self, backlog_tokens: int) -> int:
        """Prompt tokens a step must carry for `backlog_tokens` to drain within about backlog_drain_s of
        prompt-carrying steps (each about prompt_step_s; longer ones drain slower, so the floor stays up
        while the backlog does). 0 when off."""
        step_s = self.prompt_step_s
        if step_s is None or self.backlog_drain_s <= 0:
            return 0
        return int(backlog_tokens * step_s / self.backlog_drain_s)

    def prompt_budget(self, cap: int, backlog_tokens: int = 0, saturated_cap: int | None = None) -> int:
        """Prompt tokens for the next step while streams decode: the learnt budget, never more than `cap`;
        lifted to the arrival floor and the backlog floor, each up to `saturated_cap` (default `cap`); never
        fewer than MIN_PROMPT_TOKENS. The cap bounds the stall of a server that keeps up; arrivals of more
        than a cap's worth a step, or a queue that outlived BACKLOG_AGE_S, are a saturated server's, which
        admits what arrives rather than letting the queue, and TTFT, grow for as
        long as the load lasts (8 requests/s of 256-token prompts on an Intel Xeon with AMX: the arrival
        floor was ~340 tokens a step, and at the 256 cap the median TTFT was 0.9-1.2 s). Even then a step
        stalls the streams at most about SATURATED_STALL x a decode step (the learnt budget scaled to it),
        never less than the cap allows."""
        if self.stall_factor <= 1.0:
            return cap
        learnt = FIRST_PROMPT_TOKENS if self.budget is None else int(self.budget)
        queue = max(self.arrival_floor(), self.backlog_floor(backlog_tokens))
        stall_bound = int(learnt * (SATURATED_STALL - 1.0) / (self.stall_factor - 1.0))
        ceiling = cap if saturated_cap is None else max(cap, min(saturated_cap, stall_bound))
        return max(MIN_PROMPT_TOKENS, min(cap, learnt), min(ceiling, queue))


def affine_fit(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares (fixed, per_token) of seconds = fixed + per_token x tokens over (tokens, seconds) samples,
    fixed >= 0 and per_token > 0; through the origin when the tokens barely vary or the line would not fit so."""
    n = len(samples)
    mean_p = sum(p for p, _ in samples) / n
    mean_x = sum(x for _, x in samples) / n
    origin = max(mean_x / max(mean_p, 1.0), 1e-7)  # every second charged per token: at least the true slope
    var = sum((p - mean_p) ** 2 for p, _ in samples)
    if var >= (0.25 * mean_p) ** 2 * n:  # the sizes spread enough to tell the fixed part from the slope
        slope = sum((p - mean_p) * (x - mean_x) for p, x in samples) / var
        fixed = mean_x - slope * mean_p
        if slope >= MIN_SLOPE_SHARE * origin and fixed >= 0:
            return fixed, slope
    return 0.0, origin


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - SMOOTHING) * old + SMOOTHING * new
