"""Serving metrics from per-request timings: percentiles, throughput, goodput under a latency objective.

Definitions (vLLM's `bench serve` ones, so figures compare across clients):
  TTFT   send -> the first chunk carrying a generated token (not a role-only chunk)
  ITL    gaps between consecutive token chunks of one request (all gaps of all requests pooled); a
         server that sends no chunk for a token whose text it holds back (vLLM) shows two steps as one gap
  text ITL  gaps between chunks with text: what a reader sees (in the JSON, not the table)
  TPOT   (e2e - TTFT) / (output tokens - 1): time per output token after the first, queue-free
  e2e    send -> the last byte of the response
A request is *good* when it succeeded, its TTFT <= slo.ttft_s and its TPOT (its mean
inter-token gap) <= slo.itl_s; goodput counts good requests and their output tokens
per second of the run. Pure arithmetic: this module never sends a request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestTiming:
    index: int
    """Position in the workload."""
    tenant: str
    start: float
    """Seconds since the run began, when the request was sent."""
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: tuple[float, ...] = ()
    error: str | None = None
    """The kind of failure ("http 429", "timeout", "incomplete: 12/64 tokens", ...); None on success."""
    text_itl: tuple[float, ...] = ()
    """Gaps between the chunks that carried text (itl: between all token chunks)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.e2e is not None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        assert self.e2e is not None and self.ttft is not None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 1.0
    itl_s: float = 0.1

    def good(self, t: RequestTiming) -> bool:
        if not t.ok or t.ttft is None or t.ttft > self.ttft_s:
            return False
        tpot = t.tpot
        return tpot is None or tpot <= self.itl_s


@dataclass(frozen=True)
class Summary:
    requests: int
    completed: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    ttft: dict[str, float]
    itl: dict[str, float]
    tpot: dict[str, float]
    e2e: dict[str, float]
    good_requests: int
    errors: dict[str, int] = field(default_factory=dict)
    text_itl: dict[str, float] = field(default_factory=dict)

    @property
    def request_rate(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.duration_s if self.duration_s else 0.0

    @property
    def goodput(self) -> float:
        return self.good_requests / self.duration_s if self.duration_s else 0.0


def percentiles(values: list[float] | tuple[float, ...]) -> dict[str, float]:
    """mean and p50/p90/p99 (numpy's linear interpolation); NaN for no values."""
    if not values:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), **{f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}}


def summarize(timings: list[RequestTiming], duration_s: float, slo: Slo) -> Summary:
    done = [t for t in timings if t.ok]
    return Summary(
        requests=len(timings),
        completed=len(done),
        duration_s=duration_s,
        prompt_tokens=sum(t.prompt_tokens for t in done),
        output_tokens=sum(t.output_tokens for t in done),
        ttft=percentiles([t.ttft for t in done if t.ttft is not None]),
        itl=percentiles([gap for t in done for gap in t.itl]),
        tpot=percentiles([p for t in done if (p := t.tpot) is not None]),
        e2e=percentiles([t.e2e for t in done if t.e2e is not None]),
        good_requests=sum(slo.good(t) for t in timings),
        errors=dict(Counter(t.error for t in timings if t.error is not None)),
        text_itl=percentiles([gap for t in done for gap in t.text_itl]),
    )


def token_shares(timings: list[RequestTiming]) -> dict[str, float]:
    """Each tenant's share of the output tokens delivered."""
    per = Counter[str]()
    for t in timings:
        if t.ok:
            per[t.tenant] += t.output_tokens
    total = sum(per.values())
    return {k: v / total for k, v in sorted(per.items())} if total else {}
