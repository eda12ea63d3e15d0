"""Serving metrics: percentiles, TPOT, goodput under an SLO, errors by kind, token shares, arrivals."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from ops.bench.load import Arrival, arrival_times, run_load
from ops.bench.serve_stats import RequestTiming, Slo, percentiles, summarize, token_shares
from ops.bench.workloads import WorkloadRequest


def timing(i: int, ttft: float, e2e: float, out: int, tenant: str = "a", error: str | None = None) -> RequestTiming:
    gaps = tuple([(e2e - ttft) / (out - 1)] * (out - 1)) if out > 1 else ()
    return RequestTiming(i, tenant, 0.0, 10, out, ttft, e2e, gaps, error)


def test_percentiles_interpolate_linearly() -> None:
    p = percentiles(list(range(1, 101)))
    assert p["p50"] == pytest.approx(50.5) and p["p90"] == pytest.approx(90.1) and p["p99"] == pytest.approx(99.01)
    assert p["mean"] == pytest.approx(50.5)
    assert all(math.isnan(v) for v in percentiles([]).values())


def test_tpot_excludes_the_first_token() -> None:
    t = timing(0, ttft=0.5, e2e=1.5, out=11)
    assert t.tpot == pytest.approx(0.1)
    assert timing(0, 0.5, 0.5, 1).tpot is None


def test_goodput_counts_requests_meeting_both_objectives() -> None:
    slo = Slo(ttft_s=1.0, itl_s=0.1)
    ts = [timing(0, 0.5, 1.4, 11),  # good: TTFT 0.5, TPOT 0.09
          timing(1, 1.2, 2.0, 11),  # TTFT too slow
          timing(2, 0.5, 2.5, 11),  # TPOT 0.2
          timing(3, 0.2, 0.2, 1),  # one token: TTFT alone decides
          RequestTiming(4, "a", 0.0, 10, error="http 429 rate_limit_exceeded")]
    s = summarize(ts, duration_s=2.0, slo=slo)
    assert s.good_requests == 2 and s.goodput == pytest.approx(1.0)
    assert s.completed == 4 and s.requests == 5
    assert s.errors == {"http 429 rate_limit_exceeded": 1}
    assert s.output_tokens == 34 and s.output_tok_s == pytest.approx(17.0)
    assert s.ttft["p50"] == pytest.approx(0.5)


def test_token_shares_per_tenant() -> None:
    ts = [timing(0, 0.1, 1, 30, "heavy"), timing(1, 0.1, 1, 10, "light"), timing(2, 0.1, 1, 60, "heavy", "timeout")]
    assert token_shares(ts) == {"heavy": 0.75, "light": 0.25}


def test_poisson_arrivals_are_seeded_and_have_the_rate() -> None:
    a = arrival_times(2000, 4.0, seed=3)
    assert a == arrival_times(2000, 4.0, seed=3) and a[0] == 0.0
    assert np.all(np.diff(a) >= 0)
    assert len(a) / a[-1] == pytest.approx(4.0, rel=0.1)
    assert arrival_times(3, None) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_times(3, 0.0)


def test_run_load_caps_requests_in_flight() -> None:
    in_flight, peak = 0, 0

    async def send(i: int, r: WorkloadRequest, t0: float) -> RequestTiming:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return timing(i, 0.01, 0.01, 1)

    arrivals = [Arrival(i, WorkloadRequest((20,), 1), 0.0) for i in range(10)]
    timings, seconds = asyncio.run(run_load(send, arrivals, concurrency=3))
    assert peak == 3 and [t.index for t in timings] == list(range(10))
    assert seconds >= 0.04  # 10 requests, 3 at a time, 10 ms each: 4 rounds
