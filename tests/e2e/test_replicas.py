"""Two real engine processes behind one gateway: prefix affinity, and losing a replica mid-traffic.

The engines run a tiny random Llama with the default model's vocabulary and
tokenizer (fast on 2 cores; routing and failover do not depend on the weights).
They announce themselves in the session's redis-server (`--redis-url`) and the
gateway follows them (`--discover-engines`). Leaks are checked where they would
show: the survivor's KV pool and queues, the tenant's concurrency leases, and
the usage record against the tokens the clients actually received.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine_client import EngineClient
from ops.supervisor import UNIT_BACKOFF
from shared.model_store import resolve_model
from shared.protocol import Stats
from tests.e2e.conftest import _spawn, _stop, _wait_healthy
from tests.support.redis_server import free_port
from tests.support.tenant_keys import new_tenant_key
from tests.support.tiny_model import tiny_llama_folder
from tests.support.up_process import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PREFIX = "e2erep"
MAX_NUM_SEQS = 4


@dataclass
class Replicas:
    base_url: str
    folder: str
    engines: dict[str, subprocess.Popen[bytes]]
    """address -> process"""
    redis_url: str
    logs: Path

    def stats(self, address: str) -> Stats:
        return asyncio.run(_stats(address))


async def _stats(address: str) -> Stats:
    client = EngineClient(address, handshake_timeout=5)
    await client.start()
    try:
        return await client.stats()
    finally:
        await client.close()


def tiny_model_with_tokenizer(path: Path) -> Path:
    """The tiny random model, sized to the default model's vocabulary, with its tokenizer files."""
    tiny_llama_folder(path, vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, eos_token_id=2)
    source = resolve_model("smollm2").path
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, path / name)
    return path


@pytest.fixture(scope="module")
def replicas(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Replicas]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-e2e-replicas-"))
    folder = str(tiny_model_with_tokenizer(logs / "tiny"))
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    engines = {a: _spawn(["engine", "--model", folder, "--listen", a, "--redis-url", redis_url, "--redis-prefix",
                          PREFIX, "--max-num-seqs", str(MAX_NUM_SEQS), "--kv-cache-memory", "0.02",
                          "--threads", "1", "--announce-ttl", "3"], logs / f"engine-{i}.log")
               for i, a in enumerate(addresses)}
    port = free_port()
    gateway = _spawn(["gateway", "--discover-engines", "--redis-url", redis_url, "--redis-prefix", PREFIX,
                      "--port", str(port), "--model", folder, "--stall-timeout", "10"], logs / "gateway.log")
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base + "/health", {"gateway": gateway, **{f"engine-{i}": p for i, p in
                                                                 enumerate(engines.values())}}, logs)
        for a in addresses:  # both answer; then give the gateway two probe passes to have joined both
            _wait_for_engine(a)
        time.sleep(1.5)
        yield Replicas(base, folder, engines, redis_url, logs)
    finally:
        _stop(gateway)
        for p in engines.values():
            _stop(p)
        if request.session.testsfailed:
            print(f"\nreplica e2e logs kept in {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)


def _wait_for_engine(address: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            asyncio.run(_stats(address))
            return
        except Exception:
            assert time.monotonic() < deadline, f"engine {address} never answered"
            time.sleep(0.3)


def completion(r: Replicas, key: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    resp = httpx.post(r.base_url + "/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": r.folder, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def metric(r: Replicas, name: str, **labels: str) -> float:
    """The gateway's /metrics: the sum of `name`'s samples carrying these labels."""
    text = httpx.get(r.base_url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


SHARED = "You are a careful assistant. Answer in one short sentence, cite nothing, and say when unsure. " * 8  # > 4 blocks


def test_requests_sharing_a_prefix_land_on_one_replica_and_hit_its_cache(replicas: Replicas) -> None:
    key = asyncio.run(new_tenant_key(replicas.redis_url, PREFIX, "affinity", "e2e"))
    before = {a: replicas.stats(a).num_finished for a in replicas.engines}
    routed_before = metric(replicas, "pageserve:router_decisions_total", reason="affinity")
    cached = []
    for i in range(4):
        out = completion(replicas, key, SHARED + f"Question {i}: what is {i} + {i}?", 4)
        cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
    served = {a: replicas.stats(a).num_finished - before[a] for a in replicas.engines}
    assert sorted(served.values()) == [0, 4], served  # every one of them on the same replica
    home = next(a for a, n in served.items() if n == 4)  # and /metrics says so, by replica and reason
    assert metric(replicas, "pageserve:router_decisions_total", reason="affinity") - routed_before == 4
    assert metric(replicas, "pageserve:router_decisions_total", reason="affinity", replica=home) >= 4
    assert metric(replicas, "pageserve:live_replicas") == 2
    assert cached[0] == 0 and all(c >= 128 for c in cached[1:]), cached  # its prefix cache served the rest


async def _stream(r: Replicas, client: httpx.AsyncClient, key: str, prompt: str, max_tokens: int,
                  first_token: asyncio.Event) -> dict[str, Any]:
    body = {"model": r.folder, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    tokens, error, usage, done = 0, None, None, False
    async with client.stream("POST", r.base_url + "/v1/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
            elif event.get("usage") and not event.get("choices"):
                usage = event["usage"]
            elif event.get("choices"):
                # Each chunk carries the usage so far: tokens a chunk held back (partial UTF-8) count too.
                tokens = event["usage"]["completion_tokens"]
                first_token.set()
    return {"tokens": tokens, "error": error, "usage": usage, "done": done}


async def _traffic(r: Replicas, key: str, n: int, max_tokens: int, kill: str | None) -> list[dict[str, Any]]:
    first_token = asyncio.Event()
    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.create_task(_stream(r, client, key, f"{i} distinct opening words {i} then a question",
                                             max_tokens, first_token)) for i in range(n)]
        if kill is not None:
            await asyncio.wait_for(first_token.wait(), 60)
            r.engines[kill].send_signal(signal.SIGKILL)  # no goodbye, no withdrawal: a crash
        return await asyncio.gather(*tasks)


def test_killing_a_replica_mid_traffic_loses_nothing_and_leaks_nothing(replicas: Replicas) -> None:
    key = asyncio.run(new_tenant_key(replicas.redis_url, PREFIX, "failover", "e2e"))
    victim, survivor = list(replicas.engines)
    n, max_tokens = 16, 120
    results = asyncio.run(_traffic(replicas, key, n, max_tokens, kill=victim))
    completed = [x for x in results if x["error"] is None]
    cut = [x for x in results if x["error"] is not None]
    # Only what was running on the victim with tokens sent can be cut, and each is told clearly;
    # everything else (waiting there, or on the survivor) completes in full.
    assert len(cut) <= MAX_NUM_SEQS, cut
    assert all(x["tokens"] > 0 and x["error"]["code"] == "engine_unavailable" for x in cut), cut
    assert all(x["done"] and x["usage"]["completion_tokens"] == max_tokens for x in completed)
    assert len(completed) >= n - MAX_NUM_SEQS
    # The victim's queued requests (no token yet) were moved to the survivor, not failed.
    assert "moved to replica " + survivor in (replicas.logs / "gateway.log").read_text()
    assert metric(replicas, "pageserve:router_retries_total") >= 1  # ... and counted on /metrics
    assert metric(replicas, "pageserve:replica_evictions_total", reason="dead") == 1
    assert metric(replicas, "pageserve:live_replicas") == 1
    assert metric(replicas, "pageserve:replica_kv_cache_usage_perc", replica=survivor) >= 0
    assert metric(replicas, "pageserve:router_requests_cut_total") == len(cut)

    # The survivor serves everything afterwards.
    after = asyncio.run(_traffic(replicas, key, 6, 8, kill=None))
    assert all(x["error"] is None and x["usage"]["completion_tokens"] == 8 for x in after)
    assert asyncio.run(_settled(replicas, survivor, key_tenant="failover",
                                expected_requests=n + 6,
                                expected_tokens=sum(x["tokens"] for x in results + after)))


async def _settled(r: Replicas, survivor: str, key_tenant: str, expected_requests: int, expected_tokens: int) -> bool:
    """Nothing leaks: the survivor's pool is whole and idle, no lease is held, usage equals what was sent."""
    redis = aioredis.Redis.from_url(r.redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            stats = await _stats(survivor)
            leases = [k async for k in redis.scan_iter(f"{PREFIX}:conc:*") if await redis.zcard(k)]
            day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
            usage = await redis.hgetall(f"{PREFIX}:usage:tenant:{key_tenant}:{day}")
            ok = (stats.num_running == stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
                  and not leases and int(usage.get("requests", 0)) == expected_requests
                  and int(usage.get("completion_tokens", 0)) == expected_tokens)
            if ok:
                return True
            assert time.monotonic() < deadline, (stats, leases, usage, expected_requests, expected_tokens)
            await asyncio.sleep(0.3)
    finally:
        await redis.aclose()


def engine_and_gateway_ports() -> tuple[int, int]:
    """A free port P whose successor is free too (`--engine-port P --engines 2` listens on P and P + 1), and a
    gateway port picked while both are held, so it is neither. Picked one by one, P + 1 was not checked, and an
    engine once failed with "cannot listen on tcp://127.0.0.1:42732: Address already in use"."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            engine_port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", engine_port + 1))
            except OSError:
                continue
            return engine_port, free_port()


@dataclass
class Pid:
    """An engine `up` started, as `_traffic` kills it."""

    pid: int

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


def _usage(redis_url: str, tenant: str) -> dict[str, str]:
    async def read() -> dict[str, str]:
        redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
            return await redis.hgetall(f"ps:usage:tenant:{tenant}:{day}")  # type: ignore[no-any-return,misc]
        finally:
            await redis.aclose()
    return asyncio.run(read())


def _joined(address: str, deadline: float) -> None:
    """Each engine counts the gateway's connection and this probe's own: >= 2 means the gateway joined it."""
    while True:
        try:
            if asyncio.run(_stats(address)).num_gateways >= 2:
                return
        except Exception:  # still loading: no answer yet
            pass
        assert time.monotonic() < deadline, f"the gateway never joined {address}"
        time.sleep(0.5)


def test_up_with_two_engines_survives_a_killed_engine(tmp_path: Path) -> None:
    """`pageserve up --engines 2`: both serve; one SIGKILLed mid-stream is told, started again after the units'
    first back-off delay and joined again by the same gateway, while the other serves everything; usage in
    Redis equals what the clients received; Ctrl-C then stops all with status 0."""
    folder = tiny_model_with_tokenizer(tmp_path / "tiny")
    engine_port, port = engine_and_gateway_ports()
    up = UpProcess(["--engines", "2", "--model", str(folder), "--engine-port", str(engine_port), "--port", str(port),
                    "--engine-args", "--threads 1 --kv-cache-memory 0.02 --max-num-seqs 4", "--log-dir",
                    str(tmp_path / "logs")])
    try:
        pids = {m.group(1): int(m.group(2)) for m in (up.wait_for_re(rf"^(engine-{i}): tcp://\S+ +pid (\d+)", 60)
                                                      for i in range(2))}
        redis_url = up.wait_for_re(r"redis (redis://127\.0\.0\.1:\d+/0)", 300).group(1)
        key = up.wait_for(lambda x: x.strip().startswith("ps-"), 10).strip()
        addresses = [f"tcp://127.0.0.1:{engine_port + i}" for i in range(2)]
        for a in addresses:
            _joined(a, time.monotonic() + 120)
        r = Replicas(f"http://127.0.0.1:{port}", str(folder), {addresses[1]: Pid(pids["engine-1"])}, redis_url, tmp_path)  # type: ignore[dict-item]
        before = asyncio.run(_traffic(r, key, 6, 4, kill=None))  # concurrent: the router spreads them over both
        assert all(asyncio.run(_stats(a)).num_finished >= 1 for a in addresses)

        during = asyncio.run(asyncio.wait_for(_traffic(r, key, 12, 60, kill=addresses[1]), 120))  # none hangs
        cut = [x for x in during if x["error"] is not None]
        assert all(x["tokens"] > 0 and x["error"]["code"] == "engine_unavailable" for x in cut), cut
        assert all(x["done"] and x["usage"]["completion_tokens"] == 60 for x in during if x["error"] is None)
        after = asyncio.run(_traffic(r, key, 4, 4, kill=None))  # sent after the kill, before it is back
        assert all(x["error"] is None and x["usage"]["completion_tokens"] == 4 for x in after), after

        up.wait_for(lambda x: "engine-1 (" + addresses[1] + ") exited with signal SIGKILL" in x
                    and "starting it again in 2.0 s (restart 1)" in x, 10)
        back = float(up.wait_for_re(r"engine-1 is back on \S+ \(pid \d+\), ([\d.]+) s after it died", 120).group(1))
        assert UNIT_BACKOFF.first_s <= back < UNIT_BACKOFF.first_s + 60  # the back-off, then a tiny model's load
        _joined(addresses[1], time.monotonic() + 30)
        again = asyncio.run(_traffic(r, key, 6, 4, kill=None))  # the restarted engine takes traffic again
        assert asyncio.run(_stats(addresses[1])).num_finished >= 1
        received = [x["tokens"] for x in before + during + after + again]
        deadline = time.monotonic() + 15
        while (usage := _usage(redis_url, "demo")).get("completion_tokens") != str(sum(received)):
            assert time.monotonic() < deadline, (usage, sum(received), len(received))
            time.sleep(0.3)
        assert usage["requests"] == str(len(received))
        print(f"engine-1 back {back:.1f} s after SIGKILL; {len(cut)} of 12 streams cut")
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
    finally:
        up.stop()
