"""Redis stopped mid-traffic: typed 503-mapped errors, nothing crashes, service resumes on its own."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from gateway.tenancy import TenancyUnavailable, TenantStore, connect
from gateway.tenancy.admission import Admission, AdmissionConfig, Ticket
from gateway.tenancy.usage import UsageReader
from tests.gateway.tenancy.conftest import make_tenant
from tests.gateway.tenancy.restartable_redis import RestartableRedis

pytestmark = pytest.mark.anyio


@pytest.fixture
def server() -> Iterator[RestartableRedis]:
    s = RestartableRedis()
    s.start()
    yield s
    s.close()


async def traffic(store: TenantStore, admission: Admission, key: str, outcomes: Counter[str],
                  stop: asyncio.Event) -> None:
    """A client loop: authenticate, admit, settle; counts what happened, never raises."""
    while not stop.is_set():
        try:
            auth = await store.authenticate(key)
            assert auth is not None
            ticket = await admission.admit(auth, 3, 4)
            result = await ticket.settle(3, 2)
            outcomes[f"served:{result.status}"] += 1
        except TenancyUnavailable as exc:
            assert "Redis is unreachable" in exc.message and exc.status_code == 503
            outcomes["unavailable"] += 1
        await asyncio.sleep(0.01)


async def test_outage_gives_typed_errors_and_service_resumes_by_itself(server: RestartableRedis):
    client = connect(server.url)
    store = TenantStore(client, "ps", actor="test")
    admission = Admission(client, "ps", AdmissionConfig(settle_retry_s=60))
    key, auth = await make_tenant(store)
    in_flight = await admission.admit(auth, 5, 10)  # a stream that is running when Redis dies
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()
    loop_task = asyncio.create_task(traffic(store, admission, key, outcomes, stop))
    try:
        await asyncio.sleep(0.3)
        served_before = outcomes["served:settled"]
        assert served_before > 0

        server.stop()
        t0 = time.monotonic()
        with pytest.raises(TenancyUnavailable):
            await store.authenticate(key)
        with pytest.raises(TenancyUnavailable):
            await admission.admit(auth, 1, 1)
        assert time.monotonic() - t0 < 1.0, "a dead Redis must fail fast"
        assert not await store.ping() and not await admission.ping()
        deferred = await in_flight.settle(5, 7)  # the stream ends during the outage
        assert deferred.status == "deferred"
        await asyncio.sleep(0.5)
        assert outcomes["unavailable"] > 0

        server.start()
        deadline = time.monotonic() + 15
        while outcomes["served:settled"] == served_before:
            assert time.monotonic() < deadline, f"service did not resume: {outcomes}"
            await asyncio.sleep(0.05)
        assert await store.ping()
        resumed = await admission.admit(auth, 1, 1)
        assert isinstance(resumed, Ticket)
        assert (await resumed.settle(1, 0)).status == "settled"
        # the deferred settlement lands by itself once Redis is back (the background retry)
        while await client.hget(f"ps:resv:{in_flight.reservation_id}", "settled") != "1":
            assert time.monotonic() < deadline, "deferred settlement never landed"
            await asyncio.sleep(0.1)
        stop.set()
        await loop_task
        # A request admitted just before the outage and settled during it is "deferred": retried in the
        # background until it lands. Usage ends up exactly what every client was sent, each counted once.
        assert set(outcomes) <= {"served:settled", "served:deferred", "unavailable"}
        served = outcomes["served:settled"] + outcomes["served:deferred"]
        reader = UsageReader(client, "ps")
        day = dt.datetime.now(dt.UTC).date()
        while (rows := await reader.read("tenant", ["acme"], day, day))[0].requests < served + 2:
            assert time.monotonic() < deadline + 10, f"deferred settlements never landed: {rows}"
            await asyncio.sleep(0.1)
        assert rows[0].requests == served + 2  # + the in-flight stream + the admission after resume
        assert rows[0].completion_tokens == 2 * served + 7
    finally:
        stop.set()
        await loop_task
        await admission.aclose()
        await client.aclose()
