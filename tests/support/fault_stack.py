"""A stack for fault tests: processes the test may kill, restart and inspect.

redis-server (restartable, append-only file), one engine with the real default
model, one gateway; the test holds each `subprocess.Popen`, so it can SIGKILL
one and start it again on the same address. `Books` reads what must be empty
after every fault: concurrency leases, unsettled reservations (Redis) and
requests or KV blocks held (the engine's Stats), and the usage Redis recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from gateway.engine_client import EngineClient
from shared.protocol import Stats

START_TIMEOUT_S = 300.0


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "ab") as out:  # appended: a restarted process keeps one log per role
        return subprocess.Popen([sys.executable, "-m", "ops.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:  # noqa: BLE001  (not up yet: keep waiting)
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout_s:g} s")


def healthy(base_url: str) -> bool:
    return httpx.get(f"{base_url}/health", timeout=2).status_code == 200


async def _stats(address: str) -> Stats:
    client = EngineClient(address, handshake_timeout=10)
    await client.start()
    try:
        return await client.stats()
    finally:
        await client.close()


def engine_stats(address: str) -> Stats:
    return asyncio.run(_stats(address))


@dataclass
class Books:
    """What Redis and the engine hold for one prefix and tenant."""

    redis_url: str
    prefix: str
    tenant: str
    engine_address: str
    _redis: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self._redis = redis.Redis.from_url(self.redis_url, decode_responses=True)

    def leases(self) -> int:
        """Concurrency leases not yet expired, over every scope of the prefix."""
        now_ms = int(time.time() * 1000)
        return sum(int(self._redis.zcount(k, now_ms, "+inf")) for k in self._redis.scan_iter(f"{self.prefix}:conc:*"))

    def unsettled(self) -> int:
        keys = list(self._redis.scan_iter(f"{self.prefix}:resv:*"))
        return sum(self._redis.hget(k, "settled") == "0" for k in keys)

    def usage(self) -> tuple[int, int, int]:
        """(requests, prompt tokens, completion tokens) recorded for the tenant, all days."""
        totals = [0, 0, 0]
        for k in self._redis.scan_iter(f"{self.prefix}:usage:tenant:{self.tenant}:*"):
            h = self._redis.hgetall(k)
            for i, name in enumerate(("requests", "prompt_tokens", "completion_tokens")):
                totals[i] += int(h.get(name, 0))
        return totals[0], totals[1], totals[2]

    def engine_idle(self) -> bool:
        s = engine_stats(self.engine_address)
        return (s.num_running, s.num_waiting, s.num_swapped) == (0, 0, 0) and s.num_free_blocks == s.num_total_blocks

    def nothing_held(self) -> bool:
        return self.engine_idle() and self.leases() == 0 and self.unsettled() == 0

    def close(self) -> None:
        self._redis.close()
