"""Gateway streaming cost: CPU per streamed token with a model-free engine behind real ZeroMQ.

    python -m ops.bench.streaming [--streams 32] [--tokens 200] [--json PATH]

Starts a private redis-server, an in-process `EngineServer` around a synthetic
core (every running request gets one token per step, ordinary word tokens, no
model), and the real `pageserve gateway` process; then N concurrent streamed
completions of T tokens each over HTTP. Reports wall time, streamed tokens/s
and the gateway process's CPU seconds per token (from /proc, Linux): the cost
the gateway adds next to the engine on the same cores. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from engine.serving.server import EngineServer, ServerConfig
from engine.serving.synthetic_core import SyntheticCore
from ops.launcher import create_demo_key, free_port, start_redis, stop_all
from shared.model_info import ModelInfo

WORDS = [504, 3575, 282, 4649, 314, 7042, 30, 216, 18645, 250]
"""' The capital of France is Paris.' then a CJK character split over two tokens."""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_streams(base: str, key: str, streams: int, tokens: int) -> int:
    body = {"model": "smollm2", "prompt": [1, 504, 3575], "max_tokens": tokens, "stream": True}
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        async def one() -> int:
            r = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text[-300:]
            return r.text.count("data: ")
        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.streaming", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    info = ModelInfo("smollm2", max_model_len=8192, block_size=16, eos_token_id=2, num_blocks=1 << 20,
                      vocab_size=49152)
    engine = EngineServer(SyntheticCore(WORDS, 1 << 20, 16), info, ServerConfig(listen=f"tcp://127.0.0.1:{free_port()}"))
    threading.Thread(target=engine.serve, daemon=True).start()
    redis, redis_url = start_redis()
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "ops.cli", "gateway", "--engine", engine.address,
                                "--redis-url", redis_url, "--port", str(port), "--log-level", "warning"])
    base = f"http://127.0.0.1:{port}"
    try:
        key = asyncio.run(create_demo_key(redis_url, "ps", "bench"))
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        cpu0, t0 = cpu_seconds(gateway.pid), time.perf_counter()
        events = asyncio.run(run_streams(base, key, a.streams, a.tokens))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(gateway.pid) - cpu0
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(20)
        engine.request_stop()
        stop_all([redis])
    total = a.streams * a.tokens
    result = {"streams": a.streams, "tokens_per_stream": a.tokens, "sse_events": events, "wall_s": round(wall, 3),
              "tokens_per_s": round(total / wall), "gateway_cpu_s": round(cpu, 3),
              "gateway_cpu_us_per_token": round(cpu / total * 1e6, 1)}
    print(f"{'streams':>8} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'gw CPU s':>9} {'us/token':>9}")
    print(f"{a.streams:>8} {a.tokens:>7} {wall:>7.2f} {total / wall:>7.0f} {cpu:>9.2f} {cpu / total * 1e6:>9.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
