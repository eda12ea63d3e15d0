"""Limits hold across OS processes sharing one Redis, and a killed process leaks no slot past its lease."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from gateway.tenancy import QuotaExceeded
from gateway.tenancy.admission import Admission, AdmissionConfig
from tests.gateway.tenancy.conftest import make_tenant

pytestmark = pytest.mark.anyio


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.gateway.tenancy.worker", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("field", ["rpm", "concurrency", "daily_tokens"])
async def test_two_processes_bursting_together_admit_exactly_the_limit(store, client, prefix, redis_url, field):
    key, _ = await make_tenant(store, **{field: 50 if field != "daily_tokens" else 100})  # 2 tokens a request
    procs = [spawn("burst", redis_url, prefix, key, "100") for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while await client.llen(f"{prefix}:ready") < 2:
            assert time.monotonic() < deadline, [p.stderr.read() for p in procs if p.poll() is not None]
            await asyncio.sleep(0.05)
        start = time.monotonic()
        await client.rpush(f"{prefix}:go", 1, 1)
        outputs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(o["other"] == [] for o in outputs), outputs
    assert sum(o["refused"] + o["admitted"] for o in outputs) == 200
    refill = int(elapsed * 50 / 60) if field == "rpm" else 0  # zero unless the burst took over 1.2 s
    assert 50 <= sum(o["admitted"] for o in outputs) <= 50 + refill, (outputs, elapsed)


async def test_a_killed_process_holds_its_concurrency_slot_no_longer_than_the_lease(store, client, prefix,
                                                                                       redis_url):
    key, auth = await make_tenant(store, concurrency=1)
    lease_s = 1.0
    proc = spawn("hold", redis_url, prefix, key, str(lease_s), "0.2")
    admission = Admission(client, prefix, AdmissionConfig(lease_s=lease_s, heartbeat_s=0.2))
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("admitted"), proc.stderr.read()
        await asyncio.sleep(2 * lease_s)  # alive past its first lease: the heartbeat kept the slot
        with pytest.raises(QuotaExceeded, match="concurrent"):
            await admission.admit(auth, 1, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        with pytest.raises(QuotaExceeded):  # the lease outlives the process by at most lease_s
            await admission.admit(auth, 1, 1)
        while True:
            try:
                ticket = await admission.admit(auth, 1, 1)
                break
            except QuotaExceeded:
                assert time.monotonic() - killed < lease_s + 0.5, "slot held past the lease"
                await asyncio.sleep(0.05)
        assert time.monotonic() - killed <= lease_s + 0.5
        await ticket.settle(1, 1)
    finally:
        proc.kill()
        proc.wait()
        await admission.aclose()
