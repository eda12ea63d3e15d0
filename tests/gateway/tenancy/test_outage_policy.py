"""Redis-down policy: fail closed (503, logged) by default; a chosen tenant's recently admitted key is
served without quotas while Redis is unreachable. Real redis-server, stopped mid-test."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gateway.auth import admit
from gateway.tenancy import TenancyUnavailable, TenantStore, connect
from gateway.tenancy.admission import Admission, AdmissionConfig
from gateway.tenancy.outage_policy import OutagePolicy
from tests.gateway.tenancy.conftest import make_tenant
from tests.gateway.tenancy.restartable_redis import RestartableRedis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def server() -> Iterator[RestartableRedis]:
    s = RestartableRedis()
    s.start()
    yield s
    s.close()


async def test_fail_open_only_for_chosen_tenants_and_every_refusal_logged(
        server: RestartableRedis, caplog: pytest.LogCaptureFixture) -> None:
    client = connect(server.url)
    store = TenantStore(client, "ps", actor="test")
    admission = Admission(client, "ps", AdmissionConfig(settle_retry_s=60))
    policy = OutagePolicy(fail_open=frozenset({"open-co"}))
    try:
        open_key, _ = await make_tenant(store, "open-co")
        closed_key, _ = await make_tenant(store, "closed-co")
        for key in (open_key, closed_key):
            _, ticket = await admit(key, store, admission, 3, 4, policy)
            assert ticket is not None
            await ticket.settle(3, 1)
        server.stop()
        caplog.set_level(logging.WARNING)
        auth, ticket = await admit(open_key, store, admission, 3, 4, policy)
        assert auth.tenant == "open-co" and ticket is None
        with pytest.raises(TenancyUnavailable):
            await admit(closed_key, store, admission, 3, 4, policy)
        with pytest.raises(TenancyUnavailable):  # the default policy: closed for everyone
            await admit(open_key, store, admission, 3, 4)
        refusals = [r for r in caplog.records if "refused a request (fail-closed policy)" in r.getMessage()]
        assert len(refusals) == 2
        assert not any(k in r.getMessage() for r in caplog.records for k in (open_key, closed_key))
    finally:
        await admission.aclose()
        await client.aclose()
