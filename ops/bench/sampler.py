"""`pageserve bench sampler`: what one sampler step costs, with and without the OpenAI features.

A microbenchmark on random logits of the default model's vocabulary (49,152). Cases
run alternately, round after round, so a busy machine slows them all alike; the
table gives each case's median per step. `plain, transforms bypassed` replaces
every per-row transform and the logprobs step with a no-op: its gap to `plain`
is what a batch that uses none of the features pays for them (the checks alone).

    pageserve bench sampler [--rows 64] [--rounds 30] [--greedy] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import engine.worker.sampler as sampler_module
from engine.outputs import ScheduledChunk
from engine.worker.sampler import Sampler
from shared.sampling import SamplingParams

VOCAB = 49152


def rows(n: int, greedy: bool, every: int, **features: Any) -> list[ScheduledChunk]:
    """n rows; every `every`-th one (0: none) uses `features`. Each has a 300-token history."""
    out = []
    for i in range(n):
        extra = features if every and i % every == 0 else {}
        params = SamplingParams(max_tokens=512, temperature=0.0 if greedy else 0.8, top_p=1.0, **extra)
        history = [(i * 7919 + j * 104729) % VOCAB for j in range(300)]
        out.append(ScheduledChunk(f"r{i}", [1], 300, [0], True, params, 150, 2, history[:150], history[150:]))
    return out


@contextlib.contextmanager
def transforms_bypassed() -> Iterator[None]:
    """Every feature's code path replaced by a no-op: the floor a feature-free batch is measured against."""
    saved = {name: getattr(sampler_module, name) for name in
             ("apply_logit_bias", "apply_penalties", "apply_min_p", "take_raw", "mask_min_tokens")}
    sampler_module.apply_logit_bias = sampler_module.apply_penalties = lambda logits, chunks: None  # type: ignore
    sampler_module.mask_min_tokens = lambda logits, chunks: None  # type: ignore
    sampler_module.apply_min_p = lambda logits, chunks: logits  # type: ignore
    sampler_module.take_raw = lambda logits, chunks: None  # type: ignore
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(sampler_module, name, fn)


def cases(n: int, greedy: bool) -> dict[str, tuple[list[ScheduledChunk], bool]]:
    """name -> (rows, bypass the transforms)."""
    plain = rows(n, greedy, 0)
    return {
        "plain": (plain, False),
        "plain, transforms bypassed": (plain, True),
        "logprobs (top 5) on 1/4 of rows": (rows(n, greedy, 4, logprobs=5), False),
        "logprobs (top 20) on every row": (rows(n, greedy, 1, logprobs=20), False),
        "freq+presence penalty on 1/4": (rows(n, greedy, 4, frequency_penalty=0.5, presence_penalty=0.5), False),
        "repetition penalty on 1/4": (rows(n, greedy, 4, repetition_penalty=1.2), False),
        "logit_bias (3 ids) on 1/4": (rows(n, greedy, 4, logit_bias=((5, 2.0), (6, -2.0), (7, 1.0))), False),
        "min_p 0.05 on 1/4": (rows(n, greedy, 4, min_p=0.05), False),
        "all of the above on every row": (rows(n, greedy, 1, logprobs=5, frequency_penalty=0.5,
                                                presence_penalty=0.5, repetition_penalty=1.2, min_p=0.05,
                                                logit_bias=((5, 2.0),)), False),
    }


def time_one(sampler: Sampler, logits: torch.Tensor, chunks: list[ScheduledChunk], bypass: bool) -> float:
    work = logits.clone()
    guard: Callable[[], contextlib.AbstractContextManager[None]] = transforms_bypassed if bypass else contextlib.nullcontext
    with guard():
        start = time.perf_counter()
        sampler.sample_with_logprobs(work, chunks)
        return time.perf_counter() - start


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pageserve bench sampler")
    p.add_argument("--rows", type=int, default=64, help="sampled rows per step")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--greedy", action="store_true", help="temperature 0 rows (default: 0.8)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    logits = torch.randn(a.rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    table = cases(a.rows, a.greedy)
    sampler = Sampler()
    times: dict[str, list[float]] = {name: [] for name in table}
    for chunks, bypass in table.values():  # warm-up: generators, allocator, C kernels
        time_one(sampler, logits, chunks, bypass)
    for _ in range(a.rounds):
        for name, (chunks, bypass) in table.items():
            times[name].append(time_one(sampler, logits, chunks, bypass))
    base = statistics.median(times["plain, transforms bypassed"])
    print(f"sampler step, {a.rows} rows x {VOCAB} vocab, {'greedy' if a.greedy else 'temperature 0.8'}, "
          f"median of {a.rounds} alternating rounds, {torch.get_num_threads()} threads")
    print(f"{'case':<36} {'ms/step':>9} {'vs bypassed':>12}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<36} {med * 1e3:>9.3f} {med / base:>11.3f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({name: statistics.median(ts) for name, ts in times.items()}, f, indent=2)
    return 0
