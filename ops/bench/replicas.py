"""One engine replica against two, same run: throughput and time to first token through the router.

    python -m ops.bench.replicas [--model smollm2] [--requests 16] [--prompt-tokens 96]
                                 [--max-tokens 32] [--threads 1] [--rounds 2] [--json PATH]

Starts two `pageserve engine` processes (each `--threads T`), then, alternating
in every round, sends the same kind of load (N concurrent requests, distinct
random prompts, `ignore_eos`) through the gateway's replica router
(gateway/replicas/) to replica A alone and to A and B. No HTTP and no Redis: this
measures what a second replica adds, not the gateway. Prompts are fresh each
run, so no prefix cache is hit. Reports output tokens/s, mean and p90 time to
first token, and the ratio. On one machine the replicas share its cores (and
here, seven other engineers' work): read the ratio with the host's load printed
beside it. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gateway.replicas.config import ReplicasConfig
from gateway.replicas.replica_set import ReplicaSet
from ops.launcher import free_port
from shared.protocol import AddRequest, TokenDelta
from shared.sampling import SamplingParams


def start_engine(model: str, address: str, threads: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", "engine", "--model", model, "--listen", address,
                                 "--threads", str(threads), "--kv-cache-memory", "0.25"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def run_load(addresses: tuple[str, ...], args: argparse.Namespace, seed: int) -> dict[str, float]:
    replicas = ReplicaSet(ReplicasConfig(addresses=addresses, probe_interval_s=0.2, stall_timeout_s=120))
    await replicas.start(timeout_s=600)
    while len(replicas.live()) < len(addresses):
        await asyncio.sleep(0.2)
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()

    async def one(i: int) -> tuple[float, int]:
        prompt = [rng.randrange(1000, 20000) for _ in range(args.prompt_tokens)]
        stream = await replicas.router.submit(AddRequest(f"bench-{seed}-{i}", prompt, sampling))
        first, tokens = 0.0, 0
        async for item in stream:
            if isinstance(item, TokenDelta):
                first = first or time.perf_counter() - start
                tokens += len(item.new_token_ids)
        return first, tokens

    results = await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - start
    await replicas.close()
    ttft = sorted(r[0] for r in results)
    return {"replicas": len(addresses), "wall_s": wall, "output_tok_s": sum(r[1] for r in results) / wall,
            "ttft_mean_s": statistics.mean(ttft), "ttft_p90_s": ttft[int(0.9 * (len(ttft) - 1))]}


def host() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pageserve bench replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine replica")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    logs = Path(f"/tmp/pageserve-bench-replicas-{os.getpid()}")
    logs.mkdir(exist_ok=True)
    a, b = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    engines = [start_engine(args.model, addr, args.threads, logs / f"engine-{i}.log") for i, addr in enumerate((a, b))]
    rows = []
    try:
        print(f"host: {host()}", flush=True)
        for r in range(args.rounds):
            order = [(a,), (a, b)] if r % 2 == 0 else [(a, b), (a,)]  # alternate: drift hits both alike
            for addresses in order:
                row = asyncio.run(run_load(addresses, args, seed=1000 * r + len(addresses)))
                row["round"] = r
                rows.append(row)
                print(f"round {r}  replicas {row['replicas']}  {row['output_tok_s']:7.1f} tok/s  "
                      f"ttft mean {row['ttft_mean_s']:6.2f} s  p90 {row['ttft_p90_s']:6.2f} s  "
                      f"wall {row['wall_s']:6.1f} s", flush=True)
    finally:
        for proc in engines:
            proc.terminate()
        for proc in engines:
            proc.wait(timeout=30)
    one = statistics.mean(x["output_tok_s"] for x in rows if x["replicas"] == 1)
    two = statistics.mean(x["output_tok_s"] for x in rows if x["replicas"] == 2)
    print(f"mean over rounds: 1 replica {one:.1f} tok/s, 2 replicas {two:.1f} tok/s, ratio {two / one:.2f}x "
          f"({args.threads} thread(s) per replica; host {host()})")
    if args.json:
        Path(args.json).write_text(json.dumps({"host": host(), "args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
