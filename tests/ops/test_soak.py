"""The 20-second soak: real engine, gateway and redis-server; afterwards the books balance."""

from __future__ import annotations

import pytest

from ops.bench.soak import QUITTER, TENANTS, run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_five_seconds_of_streams_leave_balanced_books() -> None:
    """The suite's short soak (the long one: `python -m ops.bench.soak`, docs/benchmarks.md)."""
    r = run(clients=32, seconds=5)  # 32 clients still overlap every phase of a stream; the hour-long run is separate
    assert sum(r.requests.values()) >= len(TENANTS) * 2, r
    # The only "errors" are the quitters hanging up on purpose: no 5xx, no SSE error, no client exception.
    assert set(r.errors) <= {"client:hung_up_on_purpose"}, r.errors
    for tenant in TENANTS:
        if tenant == QUITTER:
            assert r.redis_tokens[tenant] >= r.client_tokens.get(tenant, 0)
        else:  # streams read to the end: Redis charged exactly the tokens the clients were sent
            assert r.redis_tokens[tenant] == r.client_tokens[tenant] > 0
    assert r.kv_free_blocks == r.kv_total_blocks and r.leases == 0 and r.unsettled == 0
    gateway_rss = r.rss_mib["gateway"]
    assert gateway_rss[-1] - gateway_rss[0] < 64, gateway_rss  # no growth beyond warm-up noise
