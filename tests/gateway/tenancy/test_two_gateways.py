"""Two real `pageserve gateway` processes sharing one Redis admit exactly one tenant's allowance.

Processes: the session's redis-server, one engine process (real EngineServer
loop, fake core: no model), two gateway processes. The test bursts 200
simultaneous HTTP requests, 100 at each gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.tenancy import TenantStore, connect
from gateway.tenancy.quota import LIMIT_FIELDS
from gateway.tenancy.quota_store import QuotaStore
from tests.support.redis_server import free_port

BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


LEASE_S = 1.5
"""The gateways' concurrency lease (--quota-lease): short, so a killed gateway's slot frees quickly."""


@dataclass
class Cluster:
    urls: list[str]
    redis_url: str
    prefix: str
    logs: Path
    spawn_gateway: Callable[[str], tuple[subprocess.Popen[bytes], str]]
    """Start one more gateway (log name) -> (process, base URL), healthy; stopped with the cluster."""
    keys: list[str] = field(default_factory=list)
    """Every key the tests created or tried: none may ever appear in a process log."""


def _wait_healthy(url: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "\n".join(f.read_text() for f in logs.glob("*.log"))
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never became healthy:\n" + "\n".join(f.read_text() for f in logs.glob("*.log")))


@pytest.fixture(scope="module")
def cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("two-gateways")
    prefix = "two" + secrets.token_hex(4)
    engine_address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with contextlib.ExitStack() as files:

        def spawn(name: str, *args: str) -> subprocess.Popen[bytes]:
            log = files.enter_context(open(logs / f"{name}.log", "wb"))
            return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, env=env)

        procs = [spawn("engine", "tests.gateway.tenancy.fake_engine_proc", engine_address)]

        def spawn_gateway(name: str) -> tuple[subprocess.Popen[bytes], str]:
            port = free_port()
            proc = spawn(name, "ops.cli", "gateway", "--engine", engine_address, "--redis-url", redis_url,
                         "--redis-prefix", prefix, "--port", str(port), "--log-level", "debug",
                         "--quota-lease", str(LEASE_S))
            procs.append(proc)
            _wait_healthy(f"http://127.0.0.1:{port}", procs, logs)
            return proc, f"http://127.0.0.1:{port}"

        try:
            urls = [spawn_gateway("gateway0")[1], spawn_gateway("gateway1")[1]]
            yield Cluster(urls, redis_url, prefix, logs, spawn_gateway)
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


async def _tenant(cluster: Cluster, name: str, **limits: int) -> str:
    client = connect(cluster.redis_url)
    try:
        store = TenantStore(client, cluster.prefix, actor="test")
        await store.create_tenant(name)
        key, _ = await store.create_key(name)
        cluster.keys.append(key)
        changes: dict[str, int | None | str] = {f: None for f in LIMIT_FIELDS}
        changes.update(limits)
        await QuotaStore(store).set(name, None, changes)
        return key
    finally:
        await client.aclose()


async def _burst(cluster: Cluster, key: str, per_gateway: int) -> tuple[list[int], float]:
    """200 simultaneous requests, half at each gateway: (status codes, seconds); anything but 200/429 fails."""
    responses, elapsed = await _burst_responses(cluster, key, per_gateway)
    return [r.status_code for r in responses], elapsed


async def _burst_responses(cluster: Cluster, key: str, per_gateway: int) -> tuple[list[httpx.Response], float]:
    limits = httpx.Limits(max_connections=per_gateway)
    async with httpx.AsyncClient(timeout=60, limits=limits) as a, httpx.AsyncClient(timeout=60, limits=limits) as b:
        calls = [c.post(f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
                 for c, url in ((a, cluster.urls[0]), (b, cluster.urls[1])) for _ in range(per_gateway)]
        start = time.monotonic()
        responses = await asyncio.gather(*calls)
        elapsed = time.monotonic() - start
    odd = [f"{r.status_code} {r.text[:300]}" for r in responses if r.status_code not in (200, 429)]
    assert not odd, odd[:3]
    return list(responses), elapsed


def test_two_gateways_admit_exactly_the_daily_budget(cluster: Cluster):
    probe = asyncio.run(_tenant(cluster, "probe"))
    usage = httpx.post(f"{cluster.urls[0]}/v1/chat/completions", json=BODY,
                       headers={"Authorization": f"Bearer {probe}"}, timeout=30).json()["usage"]
    per_request = usage["prompt_tokens"] + BODY["max_tokens"]  # reserved, and used in full (fake core)
    assert usage["completion_tokens"] == BODY["max_tokens"]
    key = asyncio.run(_tenant(cluster, "budget", daily_tokens=50 * per_request))
    statuses, _ = asyncio.run(_burst(cluster, key, 100))
    assert sorted(set(statuses)) == [200, 429]
    assert statuses.count(200) == 50


def test_two_gateways_admit_exactly_the_requests_per_minute(cluster: Cluster):
    key = asyncio.run(_tenant(cluster, "rpm", rpm=50))
    statuses, elapsed = asyncio.run(_burst(cluster, key, 100))
    # The bucket refills 50/60 of a request per second: a burst slower than 1.2 s (HTTP on a busy 2-core
    # host) may earn one more. Never more than that, and never fewer than the 50 the burst is owed.
    refill = int(elapsed * 50 / 60)
    assert 50 <= statuses.count(200) <= 50 + refill, (statuses.count(200), elapsed)
    assert statuses.count(200) + statuses.count(429) == 200


def test_two_gateways_admit_exactly_a_tenant_rpm_on_one_model_and_count_its_usage(cluster: Cluster):
    """Issue 42: the per-model limit is one more scope in the same Lua call, so exact across gateways too;
    usage per model equals what the clients received."""
    key = asyncio.run(_tenant(cluster, "rpm-model"))

    async def limit_model() -> None:
        client = connect(cluster.redis_url)
        try:
            await QuotaStore(TenantStore(client, cluster.prefix, actor="test")).set(
                "rpm-model", None, {"rpm": 50}, model="smollm2")
        finally:
            await client.aclose()

    asyncio.run(limit_model())
    statuses, elapsed, received = asyncio.run(_burst_usage(cluster, key, 100))
    refill = int(elapsed * 50 / 60)
    assert 50 <= statuses.count(200) <= 50 + refill, (statuses.count(200), elapsed)
    assert statuses.count(200) + statuses.count(429) == 200

    async def model_usage() -> dict[str, str]:
        client = connect(cluster.redis_url)
        try:
            day = time.strftime("%Y%m%d", time.gmtime())
            for _ in range(50):  # settlement runs after each response's last byte
                usage = await client.hgetall(f"{cluster.prefix}:usage:model:rpm-model:smollm2:{day}")
                if int(usage.get("requests", 0)) == statuses.count(200):
                    return usage
                await asyncio.sleep(0.1)
            return usage
        finally:
            await client.aclose()

    usage = asyncio.run(model_usage())
    assert int(usage["requests"]) == statuses.count(200)
    assert (int(usage["prompt_tokens"]), int(usage["completion_tokens"])) == received


async def _burst_usage(cluster: Cluster, key: str, per_gateway: int) -> tuple[list[int], float, tuple[int, int]]:
    """As `_burst`, also adding up the usage the admitted clients were told (prompt, completion)."""
    responses, elapsed = await _burst_responses(cluster, key, per_gateway)
    refused = [r for r in responses if r.status_code == 429]
    assert all("on model smollm2" in r.json()["error"]["message"] for r in refused)
    usages = [r.json()["usage"] for r in responses if r.status_code == 200]
    received = (sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages))
    return [r.status_code for r in responses], elapsed, received


def test_a_killed_gateway_holds_its_concurrency_slot_no_longer_than_the_lease(cluster: Cluster):
    key = asyncio.run(_tenant(cluster, "lease", concurrency=1))
    doomed, doomed_url = cluster.spawn_gateway("doomed")
    headers = {"Authorization": f"Bearer {key}"}
    long_stream = {**BODY, "max_tokens": 2000, "stream": True}  # the fake engine: ~1 ms a token
    first_chunk = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{doomed_url}/v1/chat/completions", json=long_stream, headers=headers,
                              timeout=30) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    first_chunk.set()
        except httpx.HTTPError:
            pass  # the gateway is killed under it

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert first_chunk.wait(20), "the long stream never started"
    other = cluster.urls[0]
    refused = httpx.post(f"{other}/v1/chat/completions", json=BODY, headers=headers, timeout=30)
    assert refused.status_code == 429 and "concurrent" in refused.json()["error"]["message"]
    assert reader.is_alive(), "the stream ended before the kill"
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    killed = time.monotonic()
    statuses = []
    while True:
        r = httpx.post(f"{other}/v1/chat/completions", json=BODY, headers=headers, timeout=30)
        statuses.append(r.status_code)
        if r.status_code == 200:
            break
        assert r.status_code == 429, r.text
        assert time.monotonic() - killed < LEASE_S + 1.0, "the dead gateway's slot outlived its lease"
        time.sleep(0.05)
    assert statuses[0] == 429  # the dead gateway's slot is still held right after the kill ...
    assert time.monotonic() - killed <= LEASE_S + 1.0  # ... and no longer than its lease
    reader.join(5)


def test_no_key_ever_reaches_a_process_log(cluster: Cluster):
    """Runs last in this module: the gateways logged at debug level through every test above."""
    wrong = "ps-" + secrets.token_urlsafe(32)
    cluster.keys.append(wrong)
    r = httpx.post(f"{cluster.urls[0]}/v1/chat/completions", json=BODY,
                   headers={"Authorization": f"Bearer {wrong}"}, timeout=30)
    assert r.status_code == 401 and wrong not in r.text
    time.sleep(0.2)  # let the gateway's log line reach the file
    logs = {path.name: path.read_text(errors="replace") for path in cluster.logs.glob("*.log")}
    assert {"engine.log", "gateway0.log", "gateway1.log"} <= set(logs)
    assert len(cluster.keys) >= 5 and any("DEBUG" in text for text in logs.values())
    for name, text in logs.items():
        for key in cluster.keys:
            assert key not in text and key[3:] not in text, f"an API key appears in {name}"
