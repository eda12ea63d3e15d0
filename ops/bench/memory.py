"""`pageserve bench memory`: KV cache waste and how many requests fit in one fixed KV budget.

    pageserve bench memory [--workload throughput] [--budget-tokens 8192] [--plot DIR] [--json PATH]

Runs a named workload (all requests at once, greedy, EOS ignored) through the engine
with its device KV pool cut to the budget, and records each step's allocated
slots, the tokens actually held, the running and waiting counts, and what two
contiguous schemes would reserve for the same running requests: a max-length slab
each (max_model_len) and an exact prompt + max_tokens slab each (needs an oracle of
the output length). Prints waste at peak allocation and over the run, and
concurrency in the budget: measured for paged (peak and mean running), computed for
the contiguous schemes (max-length: budget // max_model_len; prompt + max_tokens:
requests in arrival order until their slabs exceed the budget). `--plot` draws KV
usage over time. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
from rich.console import Console
from rich.table import Table

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from ops.bench.workloads import WORKLOADS, Workload, get_workload
from shared.sampling import SamplingParams


@dataclass(frozen=True)
class KvSample:
    t: float
    allocated: int
    """Slots in blocks held by running requests (paged)."""
    held: int
    """Tokens those requests actually have in the cache."""
    running: int
    waiting: int
    contiguous_max_len: int
    contiguous_exact: int


def fits_contiguous(w: Workload, budget: int, max_model_len: int) -> dict[str, int]:
    exact, used = 0, 0
    for r in w.requests:
        used += len(r.prompt) + r.output_len
        if used > budget:
            break
        exact += 1
    return {"contiguous_max_len": budget // max_model_len, "contiguous_prompt_plus_max_tokens": exact}


def run(core: EngineCore, w: Workload) -> list[KvSample]:
    for i, r in enumerate(w.requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
        core.add_request(Request(f"mem-{i}", list(r.prompt), params, arrival_time=0.0))
    block, max_len = core.model_info.block_size, core.model_info.max_model_len
    samples = []
    t0 = time.perf_counter()
    while core.has_unfinished():
        core.step()
        running = core.scheduler.running
        samples.append(KvSample(time.perf_counter() - t0, sum(len(r.block_ids) for r in running) * block,
                                sum(r.num_computed_tokens for r in running), len(running), len(core.scheduler.waiting),
                                len(running) * max_len,
                                sum(r.num_prompt_tokens + r.sampling.max_tokens for r in running)))
    return samples


def waste(held: int, slots: int) -> float:
    return 1.0 - held / slots if slots else 0.0


def report(samples: list[KvSample], w: Workload, budget: int, max_len: int) -> dict[str, object]:
    peak = max(samples, key=lambda s: s.allocated)
    live = [s for s in samples if s.running]
    totals = {k: sum(getattr(s, k) for s in live) for k in ("allocated", "held", "contiguous_max_len",
                                                             "contiguous_exact")}
    return {
        "budget_tokens": budget, "max_model_len": max_len, "steps": len(samples),
        "waste_at_peak": {"paged": waste(peak.held, peak.allocated),
                          "contiguous_max_len": waste(peak.held, peak.contiguous_max_len),
                          "contiguous_prompt_plus_max_tokens": waste(peak.held, peak.contiguous_exact)},
        "waste_over_run": {"paged": waste(totals["held"], totals["allocated"]),
                           "contiguous_max_len": waste(totals["held"], totals["contiguous_max_len"]),
                           "contiguous_prompt_plus_max_tokens": waste(totals["held"], totals["contiguous_exact"])},
        "concurrency": {"paged_peak": max(s.running for s in samples),
                        "paged_mean": sum(s.running for s in live) / max(1, len(live)),
                        **fits_contiguous(w, budget, max_len)},
    }


def print_report(rep: dict, console: Console) -> None:
    table = Table(title=f"KV budget {rep['budget_tokens']} tokens (max_model_len {rep['max_model_len']})")
    for c in ("scheme", "waste at peak", "waste over run", "requests that fit"):
        table.add_column(c, justify="left" if c == "scheme" else "right")
    wp, wr, cc = rep["waste_at_peak"], rep["waste_over_run"], rep["concurrency"]
    table.add_row("paged (measured)", f"{100 * wp['paged']:.1f}%", f"{100 * wr['paged']:.1f}%",
                  f"peak {cc['paged_peak']}, mean {cc['paged_mean']:.1f}")
    table.add_row("contiguous, max_model_len each", f"{100 * wp['contiguous_max_len']:.1f}%",
                  f"{100 * wr['contiguous_max_len']:.1f}%", str(cc["contiguous_max_len"]))
    table.add_row("contiguous, prompt + max_tokens each", f"{100 * wp['contiguous_prompt_plus_max_tokens']:.1f}%",
                  f"{100 * wr['contiguous_prompt_plus_max_tokens']:.1f}%", str(cc["contiguous_prompt_plus_max_tokens"]))
    console.print(table)


def plot(samples: list[KvSample], budget: int, path: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(t, [s.held for s in samples], label="tokens held")
    ax.plot(t, [s.allocated for s in samples], label="paged: allocated slots")
    ax.plot(t, [s.contiguous_exact for s in samples], label="contiguous prompt+max_tokens (same requests)", ls="--")
    ax.plot(t, [s.contiguous_max_len for s in samples], label="contiguous max_model_len (same requests)", ls=":")
    ax.axhline(budget, color="k", lw=0.8, label="KV budget")
    ax.set_ylim(0, budget * 3)
    ax.set_xlabel("seconds")
    ax.set_ylabel("KV slots (tokens)")
    ax.set_title(f"bench memory: {name}, KV usage per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pageserve bench memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--workload", default="throughput", choices=list(WORKLOADS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-tokens", type=int, default=8192, help="device KV pool, in tokens")
    p.add_argument("--limit", type=int, default=None, help="only the workload's first N requests")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--plot", metavar="DIR")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    if args.threads:
        torch.set_num_threads(args.threads)
    blocks = args.budget_tokens // args.block_size
    core = EngineCore(EngineConfig(
        model=ModelConfig(model=args.model, dtype=args.dtype),
        cache=CacheConfig(block_size=args.block_size, swap_space=0, num_device_blocks=blocks),
        scheduler=SchedulerConfig(max_num_seqs=256, enable_prefix_caching=False)))
    w = get_workload(args.workload, core.model_info.vocab_size, args.seed)
    if args.limit:
        w = Workload(w.name, w.requests[: args.limit], w.seed)
    console.print(f"workload {w.name}: {len(w.requests)} requests, {w.prompt_tokens} prompt + {w.output_tokens} output "
                  f"tokens; {args.dtype}, {torch.get_num_threads()} threads; KV pool {blocks} blocks of {args.block_size}")
    samples = run(core, w)
    rep = report(samples, w, blocks * args.block_size, core.model_info.max_model_len)
    print_report(rep, console)
    if args.plot:
        import pathlib

        pathlib.Path(args.plot).mkdir(parents=True, exist_ok=True)
        path = f"{args.plot}/memory-{w.name}-kv-usage.png"
        plot(samples, rep["budget_tokens"], path, w.name)
        console.print(f"wrote {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**rep, "samples": [asdict(s) for s in samples]}, f)
    return 0
