"""`pageserve bench soak`: many streaming clients for a while, then the books must balance.

    pageserve bench soak [--clients 256] [--seconds 60] [--json PATH]

Starts, on 127.0.0.1 only, a private redis-server, the real engine (SmolLM2) and
one gateway, three tenants with a key each, then `--clients` concurrent clients
that stream completions in a loop for `--seconds`: mixed prompt lengths and
max_tokens, and the clients of tenant "soak-quit" hang up after a few events.
It samples the gateway's and the engine's RSS every 2 s and reports:

  * requests and errors by kind (HTTP status, SSE error type, client exception);
  * RSS of both processes over time, and its trend over the second half (MiB/min);
  * usage in Redis against tokens the clients counted: exact for the tenants whose
    clients read every stream to the end (their usage chunks), at least the events
    read for the tenant whose clients hang up;
  * at the end: KV blocks free vs total, concurrency leases and unsettled reservations.

Bounded (at most 1024 clients and one hour) and loopback only: it starts everything
it talks to. A benchmark, not a test; tests/ops/test_soak.py runs a 20-second version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ops.launcher import free_port, start_redis, stop_all

TENANTS = ("soak-a", "soak-b", "soak-quit")
QUITTER = "soak-quit"
MAX_CLIENTS, MAX_SECONDS = 1024, 3600
PROMPT_LENGTHS = (8, 48, 200)
MAX_TOKENS = (4, 12, 32)


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    completion_tokens: Counter[str] = field(default_factory=Counter)
    """Per tenant: usage chunks of streams read to the end, events read for the quitters."""


@dataclass
class SoakResult:
    clients: int
    seconds: float
    requests: dict[str, int]
    errors: dict[str, int]
    rss_mib: dict[str, list[float]]
    rss_trend_mib_per_min: dict[str, float]
    client_tokens: dict[str, int]
    redis_tokens: dict[str, int]
    kv_free_blocks: int
    kv_total_blocks: int
    leases: int
    unsettled: int


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def trend(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope (MiB per minute) over the second half of (seconds, MiB) samples."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return 0.0
    n = len(half)
    mx, my = sum(t for t, _ in half) / n, sum(v for _, v in half) / n
    var = sum((t - mx) ** 2 for t, _ in half)
    return 0.0 if var == 0 else 60 * sum((t - mx) * (v - my) for t, v in half) / var


async def client_loop(base: str, tenant: str, key: str, stop_at: float, seed: int, tally: Tally,
                      http: httpx.AsyncClient) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        body = {"model": "smollm2", "prompt": [1] + [rng.randrange(300, 20000) for _ in range(rng.choice(PROMPT_LENGTHS))],
                "max_tokens": rng.choice(MAX_TOKENS), "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        quit_after = rng.randint(1, 3) if tenant == QUITTER else None
        tally.requests[tenant] += 1
        try:
            await one_stream(http, base, key, body, tenant, quit_after, tally)
        except httpx.HTTPError as e:
            tally.errors[f"client:{type(e).__name__}"] += 1


async def one_stream(http: httpx.AsyncClient, base: str, key: str, body: dict[str, Any], tenant: str,
                     quit_after: int | None, tally: Tally) -> None:
    async with http.stream("POST", f"{base}/v1/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            await r.aread()
            tally.errors[f"http:{r.status_code}"] += 1
            return
        events = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                tally.errors[f"sse:{event['error'].get('type')}"] += 1
                return
            if event.get("usage"):
                tally.completion_tokens[tenant] += event["usage"]["completion_tokens"]
            events += 1
            if quit_after is not None and events >= quit_after:
                tally.completion_tokens[tenant] += events  # a lower bound: events read before hanging up
                tally.errors["client:hung_up_on_purpose"] += 1
                return


async def make_keys(redis_url: str) -> dict[str, str]:
    from gateway.tenancy import TenantStore, connect

    client = connect(redis_url)
    try:
        store = TenantStore(client, prefix="soak", actor="soak")
        keys = {}
        for tenant in TENANTS:
            await store.create_tenant(tenant, "premium")
            keys[tenant], _ = await store.create_key(tenant)
        return keys
    finally:
        await client.aclose()


async def books(redis_url: str, engine_address: str) -> dict[str, Any]:
    """Usage per tenant, leases, unsettled reservations (Redis) and the KV pool (the engine)."""
    import redis.asyncio as aioredis

    from gateway.engine_client import EngineClient

    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        usage = {}
        for tenant in TENANTS:
            total = 0
            async for k in r.scan_iter(f"soak:usage:tenant:{tenant}:*"):
                total += int(await r.hget(k, "completion_tokens") or 0)
            usage[tenant] = total
        now_ms = int(time.time() * 1000)
        leases = sum([int(await r.zcount(k, now_ms, "+inf")) async for k in r.scan_iter("soak:conc:*")])
        unsettled = sum([await r.hget(k, "settled") == "0" async for k in r.scan_iter("soak:resv:*")])
    finally:
        await r.aclose()
    engine = EngineClient(engine_address, handshake_timeout=10)
    await engine.start()
    try:
        stats = await engine.stats()
    finally:
        await engine.close()
    return {"usage": usage, "leases": leases, "unsettled": unsettled, "free": stats.num_free_blocks,
            "total": stats.num_total_blocks}


async def drive(base: str, keys: dict[str, str], clients: int, seconds: float, pids: dict[str, int],
                rss: dict[str, list[tuple[float, float]]]) -> Tally:
    tally, t0 = Tally(), time.monotonic()
    stop_at = t0 + seconds

    async def sample() -> None:
        while True:
            for name, pid in pids.items():
                rss[name].append((time.monotonic() - t0, rss_mib(pid)))
            await asyncio.sleep(2.0)

    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), limits=limits) as http:
        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(client_loop(base, TENANTS[i % len(TENANTS)], keys[TENANTS[i % len(TENANTS)]],
                                           stop_at, i, tally, http) for i in range(clients)))
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return tally


def wait_healthy(base: str, procs: list[subprocess.Popen[bytes]], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the engine or the gateway exited during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError("the stack did not become healthy")


def run(clients: int = 256, seconds: float = 60.0, engine_args: tuple[str, ...] = ()) -> SoakResult:
    if not 1 <= clients <= MAX_CLIENTS or not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"--clients must be 1..{MAX_CLIENTS} and --seconds 0..{MAX_SECONDS}")
    redis, redis_url = start_redis()
    engine_address, port = f"tcp://127.0.0.1:{free_port()}", free_port()
    cli = [sys.executable, "-m", "ops.cli"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    engine = subprocess.Popen([*cli, "engine", "--listen", engine_address, "--kv-cache-memory", "0.5",
                               "--log-level", "warning", *engine_args], **quiet)  # type: ignore[call-overload]
    gateway = subprocess.Popen([*cli, "gateway", "--engine", engine_address, "--port", str(port),
                                "--redis-prefix", "soak", "--log-level", "warning", "--engine-timeout", "300"],
                               env={**os.environ, "PAGESERVE_REDIS_URL": redis_url},
                               **quiet)  # type: ignore[call-overload]
    base = f"http://127.0.0.1:{port}"
    try:
        keys = asyncio.run(make_keys(redis_url))
        wait_healthy(base, [engine, gateway])
        rss: dict[str, list[tuple[float, float]]] = {"gateway": [], "engine": []}
        tally = asyncio.run(drive(base, keys, clients, seconds, {"gateway": gateway.pid, "engine": engine.pid}, rss))
        time.sleep(1.0)  # settlements run after each response's last byte
        end = asyncio.run(books(redis_url, engine_address))
    finally:
        for proc in (gateway, engine):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stop_all([redis])
    return SoakResult(
        clients=clients, seconds=seconds, requests=dict(tally.requests), errors=dict(tally.errors),
        rss_mib={k: [round(v, 1) for _, v in s] for k, s in rss.items()},
        rss_trend_mib_per_min={k: round(trend(s), 2) for k, s in rss.items()},
        client_tokens=dict(tally.completion_tokens), redis_tokens=end["usage"], kv_free_blocks=end["free"],
        kv_total_blocks=end["total"], leases=end["leases"], unsettled=end["unsettled"],
    )


def report(r: SoakResult) -> str:
    lines = [f"soak: {r.clients} clients for {r.seconds:g} s (127.0.0.1)",
             f"{'tenant':<10} {'requests':>9} {'client tokens':>14} {'redis tokens':>13}"]
    for t in TENANTS:
        rule = ">=" if t == QUITTER else "=="
        lines.append(f"{t:<10} {r.requests.get(t, 0):>9} {r.client_tokens.get(t, 0):>14} "
                     f"{r.redis_tokens.get(t, 0):>13}   (redis {rule} client)")
    lines.append("errors: " + (", ".join(f"{k}={v}" for k, v in sorted(r.errors.items())) or "none"))
    for name, series in r.rss_mib.items():
        lines.append(f"{name} RSS MiB: first {series[0] if series else 0}, max {max(series, default=0)}, "
                     f"last {series[-1] if series else 0}; trend {r.rss_trend_mib_per_min[name]:+.2f} MiB/min")
    lines.append(f"end: KV free {r.kv_free_blocks}/{r.kv_total_blocks}, leases {r.leases}, "
                 f"unsettled reservations {r.unsettled}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pageserve bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    result = run(a.clients, a.seconds)
    print(report(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(asdict(result), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
