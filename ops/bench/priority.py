"""`pageserve bench priority`: urgent latency under a flood, FCFS against priority scheduling.

One process, one loaded model, the same KV pool; only the scheduler changes between runs:

  1. A flood of low-urgency long requests (priority 10) at t=0 plus a trickle of urgent
     short ones (priority 0) arriving one per `--urgent-every` seconds, run once with
     policy "fcfs" and once with "priority". Prints urgent time-to-first-token p50/p99
     (from each request's arrival) and total output tokens/s for both.
  2. Memory pressure: more concurrent requests than KV blocks, with preemption by swap
     to the CPU pool, by recompute, and by cost ("auto"). Prints output tokens/s and
     the preemption counts of each.

A benchmark prints a table (and `--json PATH` writes one); it is not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.request import Request
from engine.scheduling.scheduler import Scheduler, SchedulerConfig
from shared.sampling import SamplingParams


@dataclass(frozen=True)
class Arrival:
    at: float
    """Seconds after the run starts."""
    request: Request


@dataclass
class RunResult:
    name: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """Process CPU time: on a shared machine, the work done, free of other tenants' noise."""
    output_tokens: int = 0
    ttft: dict[str, float] = field(default_factory=dict)
    """Urgent request id -> seconds from arrival to its first token."""
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_seconds if self.cpu_seconds else 0.0


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]  # random ids above the special ones


def flood_workload(args: argparse.Namespace, tag: str) -> list[Arrival]:
    rng = random.Random(args.seed)
    out = []
    for i in range(args.low):
        params = SamplingParams(max_tokens=args.low_output, temperature=0.0, ignore_eos=True)
        prompt = tokens(rng, rng.randint(args.low_prompt // 2, args.low_prompt * 3 // 2), args.vocab)
        out.append(Arrival(0.0, Request(f"{tag}-low{i}", prompt, params, 0.0, priority=10)))
    for i in range(args.urgent):
        params = SamplingParams(max_tokens=args.urgent_output, temperature=0.0, ignore_eos=True)
        prompt = tokens(rng, rng.randint(24, 48), args.vocab)
        at = args.urgent_start + i * args.urgent_every
        out.append(Arrival(at, Request(f"{tag}-urgent{i}", prompt, params, 0.0, priority=0)))
    return sorted(out, key=lambda a: a.at)


def pressure_workload(args: argparse.Namespace, tag: str) -> list[Arrival]:
    rng = random.Random(args.seed + 1)
    params = SamplingParams(max_tokens=args.pressure_output, temperature=0.0, ignore_eos=True)
    lo, hi = args.pressure_prompt // 2, args.pressure_prompt * 3 // 2
    return [
        Arrival(0.0, Request(f"{tag}-p{i}", tokens(rng, rng.randint(lo, hi), args.vocab), params, 0.0))
        for i in range(args.pressure_requests)
    ]


def drive(core: Any, arrivals: list[Arrival], name: str) -> RunResult:
    """Feed arrivals at their times and step the core until everything finished."""
    result, pending = RunResult(name), list(arrivals)
    arrived: dict[str, float] = {}
    start, cpu_start = time.perf_counter(), time.process_time()
    while pending or core.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0].at <= now:
            arrival = pending.pop(0)
            core.add_request(arrival.request)
            arrived[arrival.request.request_id] = arrival.at
        if not core.has_unfinished():
            time.sleep(max(pending[0].at - now, 0.0))
            continue
        deltas = core.step()
        t = time.perf_counter() - start
        for d in deltas:
            result.output_tokens += len(d.new_token_ids)
            if "urgent" in d.request_id and d.new_token_ids and d.request_id not in result.ttft:
                result.ttft[d.request_id] = t - arrived[d.request_id]
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    stats = core.stats()
    result.stats = {
        k: getattr(stats, k)
        for k in ("preemptions", "priority_preemptions", "swaps_out", "recomputes", "steps")
    }
    return result


def use_scheduler(core: Any, config: SchedulerConfig, num_device_blocks: int) -> None:
    """Give the core a fresh scheduler: same weights and KV pool, another policy, and the
    first `num_device_blocks` blocks of the pool (fewer blocks: more memory pressure)."""
    old: Scheduler = core.scheduler
    assert not old.has_unfinished() and num_device_blocks <= old.bm.device.num_blocks
    config = dataclasses.replace(config, max_model_len=old.config.max_model_len)
    core.scheduler = Scheduler(config, num_device_blocks, old.bm.num_cpu_blocks, old.block_size)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve bench priority", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=49_000, help="prompts draw token ids in [3, vocab)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--low", type=int, default=32, help="low-urgency flood requests")
    p.add_argument("--low-prompt", type=int, default=256, help="mean flood prompt length")
    p.add_argument("--low-output", type=int, default=96)
    p.add_argument("--urgent", type=int, default=8)
    p.add_argument("--urgent-output", type=int, default=8)
    p.add_argument("--urgent-start", type=float, default=1.0)
    p.add_argument("--urgent-every", type=float, default=1.0)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--device-blocks", type=int, default=256, help="KV blocks of 16 tokens for part 1")
    p.add_argument("--pressure-requests", type=int, default=16)
    p.add_argument("--pressure-prompt", type=int, default=64, help="mean prompt length in part 2")
    p.add_argument("--pressure-output", type=int, default=96, help="long outputs: growth forces preemption")
    p.add_argument("--pressure-blocks", type=int, default=32, help="KV blocks for part 2 (scarce)")
    p.add_argument("--json", help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    import torch

    from engine.core import EngineCore

    args = parse(argv)
    torch.set_num_threads(args.threads)
    blocks = max(args.device_blocks, args.pressure_blocks)
    config = EngineConfig(
        model=ModelConfig(model=args.model, dtype=args.dtype),
        cache=CacheConfig(block_size=16, num_device_blocks=blocks, num_cpu_blocks=4 * blocks),
    )
    core = EngineCore(config)
    seats = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    runs = []
    for policy in ("fcfs", "priority"):
        use_scheduler(core, SchedulerConfig(policy=policy, **seats), args.device_blocks)  # type: ignore[arg-type]
        runs.append(drive(core, flood_workload(args, policy), policy))
    for mode in ("swap", "recompute", "auto"):
        sched = SchedulerConfig(preemption_mode=mode, **seats)  # type: ignore[arg-type]
        use_scheduler(core, sched, args.pressure_blocks)
        runs.append(drive(core, pressure_workload(args, mode), f"pressure/{mode}"))
    report(args, runs)
    return 0


def report(args: argparse.Namespace, runs: list[RunResult]) -> None:
    fcfs, prio = runs[0], runs[1]
    print(
        f"flood: {args.low} low (prio 10, ~{args.low_prompt} prompt, {args.low_output} out) + "
        f"{args.urgent} urgent (prio 0, {args.urgent_output} out, 1 per {args.urgent_every}s); "
        f"{args.dtype}, {args.threads} threads"
    )
    head = f"{'out tok/s':>11}{'tok/cpu-s':>11}{'seconds':>9}{'preempt':>9}"
    print(f"{'policy':<10}{'urgent TTFT p50':>17}{'p99':>9}{head}")
    for r in (fcfs, prio):
        ttft = list(r.ttft.values())
        print(f"{r.name:<10}{percentile(ttft, 0.5):>16.2f}s{percentile(ttft, 0.99):>8.2f}s{_cols(r)}")
    p99_ratio = percentile(list(fcfs.ttft.values()), 0.99) / percentile(list(prio.ttft.values()), 0.99)
    print(
        f"urgent p99 TTFT: {p99_ratio:.1f}x better with priority (target >= 5x); throughput "
        f"priority/fcfs {prio.tokens_per_s / fcfs.tokens_per_s:.2f} wall, "
        f"{prio.tokens_per_cpu_s / fcfs.tokens_per_cpu_s:.2f} per CPU second (target within 10%)"
    )
    print(f"\nmemory pressure: {args.pressure_requests} requests, {args.pressure_blocks} KV blocks of 16")
    print(f"{'mode':<20}{head}{'swaps':>7}{'recomputes':>12}")
    for r in runs[2:]:
        print(f"{r.name:<20}{_cols(r)}{r.stats['swaps_out']:>7}{r.stats['recomputes']:>12}")
    if args.json:
        rows = [
            {
                "name": r.name,
                "seconds": r.seconds,
                "cpu_seconds": r.cpu_seconds,
                "output_tokens": r.output_tokens,
                "tokens_per_s": r.tokens_per_s,
                "tokens_per_cpu_s": r.tokens_per_cpu_s,
                "ttft": r.ttft,
                **r.stats,
            }
            for r in runs
        ]
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": rows}, f, indent=2)


def _cols(r: RunResult) -> str:
    return f"{r.tokens_per_s:>11.1f}{r.tokens_per_cpu_s:>11.1f}{r.seconds:>9.1f}{r.stats['preemptions']:>9}"
