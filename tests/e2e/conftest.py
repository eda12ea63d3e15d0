"""The real stack for end-to-end tests: redis-server, `pageserve engine`, `pageserve gateway`.

One session-scoped `Stack`: the engine process with the default model and the
gateway process joined by ZeroMQ, the session's private redis-server, a tenant
with a working key and a revoked key. Tests talk plain HTTP (httpx) to the
gateway and read engine stats through their own `EngineClient` (an engine
serves many gateways). Process logs go to files printed when start-up fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.engine_client import EngineClient
from shared.protocol import Stats
from tests.support.redis_server import free_port

START_TIMEOUT_S = 300.0
E2E_DTYPE = os.environ.get("PAGESERVE_E2E_DTYPE", "float32")
"""The engine's dtype here: float32 was measured faster than bfloat16 through the engine at 08:20."""


@dataclass
class Stack:
    base_url: str
    engine_address: str
    key: str
    revoked_key: str
    logs: Path

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def stats(self) -> Stats:
        return asyncio.run(_stats(self.engine_address))


async def _stats(address: str) -> Stats:
    client = EngineClient(address, handshake_timeout=10)
    await client.start()
    try:
        return await client.stats()
    finally:
        await client.close()


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "ops.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(url: str, procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {p.returncode} during start-up:\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the stack was not healthy within {START_TIMEOUT_S:g} s (logs in {logs})")


async def _make_keys(redis_url: str) -> tuple[str, str]:
    from gateway.tenancy import TenantStore, connect

    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix="e2e", actor="e2e")
        await store.create_tenant("e2e-tenant")
        key, _ = await store.create_key("e2e-tenant")
        revoked, info = await store.create_key("e2e-tenant")
        await store.revoke_key(info.id)
        return key, revoked
    finally:
        await redis.aclose()


@pytest.fixture(scope="session")
def stack(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-e2e-"))
    engine_address = f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    procs = {
        # A small KV pool keeps memory modest (0.5 GiB: ~700 blocks of 16 tokens in float32).
        "engine": _spawn(["engine", "--model", "smollm2", "--listen", engine_address, "--dtype", E2E_DTYPE,
                          "--kv-cache-memory", "0.5"], logs / "engine.log"),
        "gateway": _spawn(["gateway", "--engine", engine_address, "--redis-url", redis_url, "--port", str(port),
                           "--model", "smollm2", "--redis-prefix", "e2e", "--engine-timeout", str(START_TIMEOUT_S)],
                          logs / "gateway.log"),
    }
    try:
        key, revoked = asyncio.run(_make_keys(redis_url))
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base + "/health", procs, logs)
        yield Stack(base, engine_address, key, revoked, logs)
    finally:
        _stop(procs["gateway"])
        _stop(procs["engine"])
        if request.session.testsfailed:
            print(f"\ne2e process logs kept in {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)
