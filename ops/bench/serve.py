"""`pageserve bench serve`: streamed load over HTTP against any OpenAI-compatible server, peers in the same run.

    pageserve bench serve --spawn [--workload chat] [--request-rate 2,4] [--gateway-overhead]
                          [--vllm-python /work/vllm-venv/bin/python] [--plot docs/bench] [--json out.json]
    pageserve bench serve --base-url http://host:8000 --api-key KEY [--tenant-key light=KEY2 ...]

Sends a named workload (ops/bench/workloads.py) with Poisson arrivals at each rate
of `--request-rate` (a comma list is a sweep; `inf` sends all at once), capped by
`--concurrency` when given, and reports TTFT, ITL, TPOT, e2e at p50/p90/p99, request
and token throughput, goodput under `--slo-ttft`/`--slo-itl`, and errors by kind; with a peer, a
second table puts the two side by side at each load and marks where ours is at least as good.
`--closed-loop N` then runs N closed-loop streams per system and prints p99 ITL over the median.
vLLM's `bench serve` load (issue 41): `--random 64 256 128 --dtype bfloat16 --request-rate 2,8`.
Each system first gets two small unrecorded warm-up requests.
`--spawn` starts our stack (redis, engine, gateway) for the run; `--gateway-overhead`
then also sends the same arrivals to the engine alone over ZeroMQ, gateway and engine
alternating (ABBA), and prints median TTFT through the gateway over the engine's.
`--vllm-python` starts `vllm serve` on loopback after our stack has stopped and runs the
same loads against it; without it the vLLM row says so. `multitenant` first runs the
light tenant alone at its own arrival times, then both, and prints each tenant's
latency, token share and the light tenant's p99 TTFT with the flood over alone.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import platform
import shlex
import signal
import statistics
import sys
from typing import Any

import httpx
from rich.console import Console

from ops.bench import vllm_peer
from ops.bench.engine_direct import EngineDirect
from ops.bench.load import Arrival, run_load, schedule
from ops.bench.openai_client import ENDPOINTS, Target, send_openai
from ops.bench.serve_report import (
    RunResult,
    closed_loop_label,
    plot,
    print_results,
    print_versus,
    smoothness_lines,
    tenant_table,
    write_json,
)
from ops.bench.serve_stats import Slo
from ops.bench.stack import SpawnedStack
from ops.bench.workloads import (
    DEFAULT_VOCAB,
    FIRST_ORDINARY_ID,
    LIGHT,
    WORKLOADS,
    Workload,
    WorkloadRequest,
    get_workload,
    make_random,
)
from ops.launcher import free_port
from pageserve_kernels.isa_cap import host_summary
from shared.gc_pauses import freeze_startup_objects
from shared.model_store import resolve_model

console = Console(width=None if sys.stdout.isatty() else 200)  # logs keep whole rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", help="an OpenAI-compatible server (not with --spawn)")
    p.add_argument("--api-key", default="", help="key for every tenant without its own --tenant-key")
    p.add_argument("--tenant-key", action="append", default=[], metavar="TENANT=KEY")
    p.add_argument("--spawn", action="store_true", help="start redis, engine and gateway for this run")
    p.add_argument("--engine-args", default="", help="extra `pageserve engine` flags with --spawn, as one string")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="spawned engine and vLLM")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the spawned engine and for vLLM (default: each one's own choice)")
    p.add_argument("--endpoint", default="completions", choices=ENDPOINTS)
    p.add_argument("--workload", default="throughput", choices=list(WORKLOADS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random", type=int, nargs=3, metavar=("N", "PROMPT", "OUTPUT"),
                   help="instead of a named workload: N requests of PROMPT random ids and OUTPUT tokens each "
                        "(to match another client's synthetic setup)")
    p.add_argument("--limit", type=int, default=None,
                   help="only the workload's first N requests (a quick look; the named workload is all of them)")
    p.add_argument("--request-rate", default="2", help="requests/s, Poisson; comma list sweeps; inf: all at once")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--closed-loop", type=int, default=0, metavar="N",
                   help="after the rates, N closed-loop streams (the workload all at once, N in flight) for each "
                        "system: prints p99 ITL over the median (issue 41: within 3x at 8)")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="seconds (goodput)")
    p.add_argument("--slo-itl", type=float, default=0.1, help="seconds, per request's mean inter-token gap")
    p.add_argument("--gateway-overhead", action="store_true", help="also run the engine alone (needs --spawn)")
    p.add_argument("--vllm-python", metavar="PATH", help="vLLM's Python: run `vllm serve` on the same loads")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--json", metavar="PATH", help="every request's timings")
    p.add_argument("--plot", metavar="DIR", help="write PNG charts there")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if bool(args.spawn) == bool(args.base_url):
        p.error("give exactly one of --spawn and --base-url")
    if args.gateway_overhead and not args.spawn:
        p.error("--gateway-overhead needs --spawn (the engine's ZeroMQ address)")
    return args


def rates(text: str) -> list[float | None]:
    return [None if r.strip() in ("inf", "") else float(r) for r in text.split(",")]


def load_label(rate: float | None, concurrency: int | None) -> str:
    label = "all at once" if rate is None else f"rate {rate:g}/s"
    return label + (f", concurrency {concurrency}" if concurrency else "")


async def _http_run(target: Target, arrivals: list[Arrival], args: argparse.Namespace, label: str,
                    concurrency: int | None = None) -> tuple[Any, float]:
    concurrency = concurrency or args.concurrency
    limits = httpx.Limits(max_connections=len(arrivals) + 8, max_keepalive_connections=len(arrivals) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout, connect=30), limits=limits) as client:
        async def send(i: int, r: Any, t0: float) -> Any:
            return await send_openai(client, target, i, r, t0)

        return await run_load(send, arrivals, concurrency, not args.no_progress, label)


async def _direct_run(address: str, arrivals: list[Arrival], args: argparse.Namespace, label: str) -> tuple[Any, float]:
    async with EngineDirect(address) as direct:
        return await run_load(direct.send, arrivals, args.concurrency, not args.no_progress, label)


def uncached(req: WorkloadRequest, salt: int = 1) -> WorkloadRequest:
    """The same request with its first token shifted by `salt` (0: unchanged): each run of one system gets
    its own salt, so no run finds the prompts of an earlier one in the prefix cache (block hashes chain
    from the first block), while prompts sharing a prefix within a run still share it."""
    span = DEFAULT_VOCAB - FIRST_ORDINARY_ID
    first = FIRST_ORDINARY_ID + (req.prompt[0] - FIRST_ORDINARY_ID + salt) % span
    return dataclasses.replace(req, prompt=(first, *req.prompt[1:]))


def salted(arrivals: list[Arrival], salt: int) -> list[Arrival]:
    return [Arrival(a.index, uncached(a.request, salt), a.at) for a in arrivals]


def run_target(target: Target, w: Workload, args: argparse.Namespace, engine_address: str = "") -> list[RunResult]:
    """Every load for one system (plus the engine alone, ABBA, or the light tenant alone, when asked)."""
    slo = Slo(args.slo_ttft, args.slo_itl)
    out = []
    warm = [Arrival(i, WorkloadRequest(tuple(range(100, 116)), 4, w.requests[0].tenant), 0.0) for i in range(2)]
    asyncio.run(_http_run(target, warm, args, "warm-up"))  # first-step costs are no one's latency
    freeze_startup_objects()  # the client's own full collections would read as the server's inter-token gaps
    salts = itertools.count()
    for rate in rates(args.request_rate):
        label = load_label(rate, args.concurrency)
        arrivals = schedule(w, rate, args.seed)
        if w.name == "multitenant":
            alone = salted([a for a in arrivals if a.request.tenant == LIGHT], next(salts))
            timings, secs = asyncio.run(_http_run(target, alone, args, f"{target.name} light alone"))
            out.append(RunResult(f"{target.name} (light alone)", label, w.name, timings, secs, slo))
        order = ["gateway", "engine", "engine", "gateway"] if engine_address else ["gateway"]
        for leg in order:
            name = target.name if leg == "gateway" else f"{target.name} engine alone (ZeroMQ)"
            sent = salted(arrivals, next(salts))
            run = (_http_run(target, sent, args, f"{name} {label}") if leg == "gateway"
                   else _direct_run(engine_address, sent, args, f"{name} {label}"))
            timings, secs = asyncio.run(run)
            out.append(RunResult(name, label, w.name, timings, secs, slo))
            console.print(f"  {name}, {label}: {out[-1].summary.completed}/{len(arrivals)} done in {secs:.1f}s, "
                          f"median TTFT {1000 * out[-1].summary.ttft['p50']:.0f} ms")
    if args.closed_loop:
        label = closed_loop_label(args.closed_loop)
        sent = salted(schedule(w, None, args.seed), next(salts))
        timings, secs = asyncio.run(_http_run(target, sent, args, f"{target.name} {label}", args.closed_loop))
        out.append(RunResult(target.name, label, w.name, timings, secs, slo))
    return out


def run_ours(w: Workload, args: argparse.Namespace) -> list[RunResult]:
    keys = dict(kv.split("=", 1) for kv in args.tenant_key)
    if not args.spawn:
        target = Target("server", args.base_url, args.model, {"default": args.api_key, **keys}, args.endpoint,
                        _detokenizer(args))
        return run_target(target, w, args)
    engine_args = ["--dtype", args.dtype, *(["--threads", str(args.threads)] if args.threads else []),
                   *shlex.split(args.engine_args)]
    with SpawnedStack(args.model, w.tenants, engine_args) as stack:
        target = Target("pageserve", stack.base_url, args.model, stack.keys, args.endpoint, _detokenizer(args))
        return run_target(target, w, args, stack.engine_address if args.gateway_overhead else "")


def run_vllm(w: Workload, args: argparse.Namespace) -> list[RunResult]:
    reason = vllm_peer.missing_reason(args.vllm_python)
    slo = Slo(args.slo_ttft, args.slo_itl)
    if reason or args.vllm_python is None:
        return [RunResult("vLLM serve", "-", w.name, [], 0.0, slo, error=reason)]
    # Served under the name our requests carry (a folder's path too, not only "smollm2").
    server = vllm_peer.VllmServer(args.vllm_python, str(resolve_model(args.model).path), args.dtype, free_port(),
                                  served_name=args.model, threads=args.threads)
    with server:
        console.print("starting vllm serve (a minute or more on 2 cores) ...")
        try:
            server.wait_ready()
        except RuntimeError as e:
            return [RunResult("vLLM serve", "-", w.name, [], 0.0, slo, error=f"failed: {e}")]
        return run_target(Target("vLLM serve", server.base_url, args.model, {}, args.endpoint, _detokenizer(args)),
                          w, args)


def _detokenizer(args: argparse.Namespace) -> Any:
    if args.endpoint != "chat":
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(resolve_model(args.model).path / "tokenizer.json"))
    return lambda ids: tok.decode(ids)


def gateway_overhead(results: list[RunResult]) -> list[str]:
    lines = []
    for label in dict.fromkeys(r.load for r in results):
        gw = [r.summary.ttft["p50"] for r in results if r.load == label and r.system == "pageserve"]
        eng = [r.summary.ttft["p50"] for r in results if r.load == label and r.system.endswith("(ZeroMQ)")]
        if gw and eng:
            g, e = statistics.mean(gw), statistics.mean(eng)
            lines.append(f"gateway overhead, {label}: median TTFT {1000 * g:.0f} ms through the gateway vs "
                         f"{1000 * e:.0f} ms engine alone ({g / e:.3f}x, mean of the ABBA halves)")
    return lines


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # unwind: the spawned stack stops too
    w = get_workload(args.workload, seed=args.seed)
    if args.random:
        n, plen, olen = args.random
        w = make_random(n, (plen, plen), (olen, olen), seed=args.seed, name=f"random-{plen}-{olen}")
    if args.limit:
        w = Workload(f"{w.name}", w.requests[: args.limit], w.seed)
    console.print(f"workload {w.name}: {len(w.requests)} requests, {w.prompt_tokens} prompt + {w.output_tokens} "
                  f"output tokens, greedy, EOS ignored; {args.endpoint}, {args.dtype}; host {platform.node()}: "
                  f"{host_summary()}")
    results = run_ours(w, args)
    if args.spawn or args.vllm_python:
        results += run_vllm(w, args)
    print_results(results, f"bench serve, workload {w.name} (SLO: TTFT <= {args.slo_ttft:g} s, "
                           f"TPOT <= {1000 * args.slo_itl:g} ms)", console)
    print_versus(results, console)
    for line in gateway_overhead(results) + smoothness_lines(results):
        console.print(line)
    if w.name == "multitenant":
        for r in results:
            if "(light alone)" not in r.system and not r.error:
                alone = next((a for a in results if a.system.startswith(r.system) and "(light alone)" in a.system
                              and a.load == r.load), None)
                console.print(tenant_table(r, alone))
    if args.json:
        write_json(args.json, results, {"workload": w.name, "endpoint": args.endpoint, "dtype": args.dtype,
                                        "request_rate": args.request_rate, "concurrency": args.concurrency,
                                        "seed": args.seed, "host": platform.node()})  # never the keys
    if args.plot:
        for f in plot(results, args.plot, w.name):
            console.print(f"wrote {f}")
    return 0
