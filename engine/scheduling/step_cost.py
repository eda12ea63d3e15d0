"""What a step costs on this host, learnt from the steps the engine runs: the serving mode's time budget.

A prompt step stalls every generating stream for its whole length. A fixed token budget
bounds that stall differently on every host and load (64 prompt tokens stretched a decode
step 2.7x on an AVX-512 Xeon, 3.1x on a Zen 4 EPYC at 8 streams; with 64 streams the same
64 tokens barely show). So the engine times its own steps (EngineCore feeds `observe`) and
keeps two running estimates:

    decode_step_s    a decode-only step, as the batch runs now            (EWMA)
    prompt_token_s   the extra seconds one prompt token adds to a step     (EWMA over mixed steps)

and `prompt_budget(stall_factor)` admits as many prompt tokens as keep a mixed step under
stall_factor x a decode-only step: few streams get short prompt chunks (their inter-token
latency stays flat), many streams absorb long ones (first tokens come sooner). Until both
are measured the token cap alone applies. Pure Python: no clock of its own, no torch.

Off by default (--prefill-stall-factor 0), measured on a Zen 4 EPYC: at 2.5 it took p99 ITL at 8
concurrent streams from 3.47x to 2.81x the median, but over HTTP in bfloat16 at 2 requests/s it
starved new prompts (median TTFT 5.5 s against 0.52 s). The model is linear: a short chunk's fixed
cost (its attention call, new product shapes) is charged to each of its few tokens, the per-token
estimate grows, and the budget it yields shrinks itself. Before it can be the default it needs an
affine fit (overhead + per token over recent mixed steps) and a floor that keeps up with arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import SchedulerOutput

SMOOTHING = 0.2
"""Weight of the newest step in each running estimate: about the last ten steps count."""
MIN_PROMPT_TOKENS = 16
"""A step that carries prompt tokens at all carries at least this many (a prompt always moves)."""


@dataclass
class StepCosts:
    decode_step_s: float | None = None
    """Seconds of a decode-only step lately (None: none seen yet)."""
    prompt_token_s: float | None = None
    """Seconds one prompt token adds to a step beside its decodes (None: no mixed step seen yet)."""

    def observe(self, out: SchedulerOutput, seconds: float) -> None:
        """One executed step: its schedule and how long the runner took."""
        if not out.chunks or seconds <= 0:
            return
        prompt_chunks = [len(c.token_ids) for c in out.chunks if len(c.token_ids) > 1]
        prompt_tokens, decodes = sum(prompt_chunks), len(out.chunks) - len(prompt_chunks)
        if prompt_tokens == 0:
            self.decode_step_s = _blend(self.decode_step_s, seconds)
        elif decodes and self.decode_step_s is not None:
            # a mixed step: what its prompt tokens added over the decode step it would have been
            extra = max(seconds - self.decode_step_s, 0.0) / prompt_tokens
            self.prompt_token_s = _blend(self.prompt_token_s, extra)

    def prompt_budget(self, stall_factor: float, cap: int) -> int:
        """Prompt tokens for the next step while streams decode: the step stays under stall_factor x
        a decode-only step; never more than `cap`, never fewer than MIN_PROMPT_TOKENS."""
        if self.decode_step_s is None or not self.prompt_token_s:
            return cap
        fit = int((stall_factor - 1.0) * self.decode_step_s / self.prompt_token_s)
        return max(MIN_PROMPT_TOKENS, min(cap, fit))


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - SMOOTHING) * old + SMOOTHING * new
