"""Concurrency leases survive Redis losing them: the heartbeat of a running request re-establishes its
lease, so once Redis is back a tenant cannot go past its concurrency limit (real redis-server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.tenancy import QuotaExceeded, TenantStore, connect
from gateway.tenancy.admission import Admission, AdmissionConfig
from tests.gateway.tenancy.conftest import make_tenant
from tests.gateway.tenancy.restartable_redis import RestartableRedis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LEASE = AdmissionConfig(lease_s=0.6, heartbeat_s=0.15, settle_retry_s=60)


@pytest.fixture
def server() -> Iterator[RestartableRedis]:
    s = RestartableRedis()
    s.start()
    yield s
    s.close()


async def test_an_outage_longer_than_the_lease_does_not_free_a_running_slot(server: RestartableRedis) -> None:
    client = connect(server.url)
    store = TenantStore(client, "ps", actor="test")
    admission = Admission(client, "ps", LEASE)
    try:
        _, auth = await make_tenant(store, concurrency=1)
        running = await admission.admit(auth, 5, 10)
        server.stop()
        await asyncio.sleep(LEASE.lease_s + 1.3)  # the leases and their set (lease + 1 s) have run out
        server.start()
        await asyncio.sleep(3 * LEASE.heartbeat_s)  # the running request's heartbeat puts its lease back
        with pytest.raises(QuotaExceeded) as refused:
            await admission.admit(auth, 5, 10)
        assert "concurrent" in refused.value.message
        await running.settle(5, 3)
        await (await admission.admit(auth, 5, 10)).settle(5, 1)  # the slot is free once it settled
    finally:
        await admission.aclose()
        await client.aclose()


async def test_redis_losing_everything_still_gets_the_lease_back(server: RestartableRedis) -> None:
    client = connect(server.url)
    store = TenantStore(client, "ps", actor="test")
    admission = Admission(client, "ps", LEASE)
    try:
        _, auth = await make_tenant(store, concurrency=1)
        running = await admission.admit(auth, 5, 10)
        await client.flushall()  # a restart without persistence: reservations and leases are gone
        _, auth = await make_tenant(store, concurrency=1)  # the operator restores the tenant
        await asyncio.sleep(3 * LEASE.heartbeat_s)
        with pytest.raises(QuotaExceeded):
            await admission.admit(auth, 5, 10)
        await running.settle(5, 3)
    finally:
        await admission.aclose()
        await client.aclose()
