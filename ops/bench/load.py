"""When requests are sent: Poisson arrivals at a rate, all at once, and an optional cap on those in flight.

    times = arrival_times(n, rate=4.0, seed=0)          # seconds from the start; rate None: all at 0
    timings, seconds = await run_load(send, schedule, concurrency=8, progress=True)

`send(index, request, t0)` is any coroutine returning a RequestTiming (the HTTP
client, the engine-only client, a fake in tests). A request whose arrival time has
come waits for a free slot when `concurrency` is set, and its TTFT clock starts
when it is actually sent (vLLM's convention). The run's duration ends at the last
completion. This module owns timing of arrivals; it knows no wire format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ops.bench.serve_stats import RequestTiming
from ops.bench.workloads import Workload, WorkloadRequest

Send = Callable[[int, WorkloadRequest, float], Awaitable[RequestTiming]]


@dataclass(frozen=True)
class Arrival:
    index: int
    request: WorkloadRequest
    at: float
    """Seconds after the run starts."""


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Poisson process: exponential gaps of mean 1/rate, the first request at 0; rate None or inf: all at 0."""
    if rate is None or np.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]


def schedule(workload: Workload, rate: float | None, seed: int = 0) -> list[Arrival]:
    times = arrival_times(len(workload.requests), rate, seed)
    return [Arrival(i, r, t) for i, (r, t) in enumerate(zip(workload.requests, times, strict=True))]


async def run_load(send: Send, arrivals: list[Arrival], concurrency: int | None = None, progress: bool = False,
                   label: str = "requests") -> tuple[list[RequestTiming], float]:
    slots = asyncio.Semaphore(concurrency) if concurrency else None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=True, disable=not progress)
    task = bar.add_task(label, total=len(arrivals))
    t0 = time.perf_counter()

    async def one(a: Arrival) -> RequestTiming:
        if slots is None:
            timing = await send(a.index, a.request, t0)
        else:
            async with slots:
                timing = await send(a.index, a.request, t0)
        bar.advance(task)
        return timing

    tasks = []
    with bar:
        for a in sorted(arrivals, key=lambda a: a.at):
            delay = t0 + a.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(a)))
        timings = await asyncio.gather(*tasks)
    return sorted(timings, key=lambda t: t.index), time.perf_counter() - t0
