"""`Admission.admit_key`: the key lookup and the quota check in one script, with nothing cached.

A key that must not authenticate gets None and is charged nothing; a revoked
key, a suspended tenant and the end of a rotation's grace hold from the very
next call; refusals are the same QuotaExceeded as `admit` gives.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.tenancy import QuotaExceeded, TenantStore
from gateway.tenancy.admission import Admission, Ticket
from gateway.tenancy.tiers import TIERS
from tests.gateway.tenancy.conftest import make_tenant

pytestmark = pytest.mark.anyio


async def admitted(admission: Admission, key: str) -> bool:
    """True if the key is admitted (its ticket settled at once), False if it must get 401."""
    result = await admission.admit_key(key, 1, 1)
    if result is None:
        return False
    await result[1].settle(1, 1)
    return True


async def test_one_call_gives_the_same_context_as_authenticate_and_a_ticket(store, admission):
    key, auth = await make_tenant(store, "acme", tier="premium", rpm=10)
    result = await admission.admit_key(key, 12, 30)
    assert result is not None
    context, ticket = result
    assert context == auth  # key id, tenant, tier, priority, weight, cache salt
    assert ticket.headers["x-ratelimit-limit-requests"] == "10"
    assert ticket.headers["x-ratelimit-remaining-requests"] == "9"
    settled = await ticket.settle(12, 7)
    assert (settled.status, settled.charged_tokens, settled.refunded_tokens) == ("settled", 19, 23)


async def test_the_tier_default_limits_are_chosen_inside_the_script(store: TenantStore, admission, client, prefix):
    await store.create_tenant("free-co", tier="free")
    key, _ = await store.create_key("free-co")
    context, ticket = await admission.admit_key(key, 1, 1)
    assert context.tier == "free"
    assert ticket.headers["x-ratelimit-limit-requests"] == str(TIERS["free"].limits.rpm)
    await ticket.settle(1, 1)
    await client.hset(f"{prefix}:tenant:free-co", "tier", "gold")  # a tier this gateway does not know
    context, ticket = await admission.admit_key(key, 1, 1)
    assert (context.tier, context.priority) == ("standard", TIERS["standard"].priority)
    assert ticket.headers["x-ratelimit-limit-requests"] == str(TIERS["standard"].limits.rpm)
    await ticket.settle(1, 1)


@pytest.mark.parametrize("token", ["", "nope", "ps-short", "ps-" + "A" * 43])
async def test_unknown_or_malformed_keys_get_none(store, admission, token):
    await make_tenant(store)
    assert await admission.admit_key(token, 1, 1) is None


async def test_a_refused_key_is_charged_nothing(store: TenantStore, admission, client, prefix):
    key, _ = await make_tenant(store, rpm=1, concurrency=1, daily_tokens=100)
    revoked, info = await store.create_key("acme")
    await store.revoke_key(info.id)
    before = sorted([k async for k in client.scan_iter(match=f"{prefix}:*")])
    for token in (revoked, "ps-" + "B" * 43):
        for _ in range(5):
            assert await admission.admit_key(token, 10, 10) is None
    assert sorted([k async for k in client.scan_iter(match=f"{prefix}:*")]) == before  # nothing written
    result = await admission.admit_key(key, 10, 10)  # the one request a minute is still there
    assert result is not None and result[1].headers["x-ratelimit-remaining-requests"] == "0"
    await result[1].settle(10, 10)


async def test_revocation_holds_from_the_very_next_call(store: TenantStore, admission):
    key, _ = await make_tenant(store)
    other, info = await store.create_key("acme")
    assert await admitted(admission, other)
    await store.revoke_key(info.id)
    assert not await admitted(admission, other)
    assert await admitted(admission, key)


async def test_suspension_holds_from_the_very_next_call_and_resume_restores(store: TenantStore, admission):
    key, _ = await make_tenant(store)
    assert await admitted(admission, key)
    await store.suspend_tenant("acme")
    assert not await admitted(admission, key)
    await store.resume_tenant("acme")
    assert await admitted(admission, key)


async def test_rotation_grace_admits_both_keys_until_it_ends(store: TenantStore, admission):
    old, _ = await make_tenant(store)
    old_id = (await store.list_keys("acme"))[0].id
    new, _ = await store.rotate_key(old_id, grace_s=0.4)
    assert await admitted(admission, old) and await admitted(admission, new)
    await asyncio.sleep(0.6)
    assert not await admitted(admission, old)
    assert await admitted(admission, new)
    newer, _ = await store.rotate_key((await store.authenticate(new)).key_id, grace_s=0)
    assert not await admitted(admission, new) and await admitted(admission, newer)


async def test_a_deleted_tenant_s_key_stays_out_when_the_name_is_taken_again(store: TenantStore, admission,
                                                                               client, prefix):
    old, _ = await make_tenant(store)
    key_id = (await store.list_keys("acme"))[0].id
    record = await client.hgetall(f"{prefix}:key:{key_id}")
    await store.delete_tenant("acme")
    await store.create_tenant("acme")
    # Even with the old key's records put back by hand, its tenant id no longer matches.
    await client.hset(f"{prefix}:key:{key_id}", mapping=record)
    await client.set(f"{prefix}:keyhash:{record['hash']}", key_id)
    assert await store.authenticate(old) is None
    assert await admission.admit_key(old, 1, 1) is None


async def test_refusals_are_the_same_as_admit_gives(store: TenantStore, admission):
    key, auth = await make_tenant(store, rpm=1)
    first = await admission.admit_key(key, 1, 1)
    assert first is not None
    with pytest.raises(QuotaExceeded) as by_key:
        await admission.admit_key(key, 1, 1)
    with pytest.raises(QuotaExceeded) as by_auth:
        await admission.admit(auth, 1, 1)
    assert by_key.value.body()["error"]["type"] == by_auth.value.body()["error"]["type"] == "requests"
    assert by_key.value.code == by_auth.value.code == "rate_limit_exceeded"
    assert set(by_key.value.headers) == set(by_auth.value.headers) >= {"retry-after", "retry-after-ms",
                                                                        "x-ratelimit-limit-requests"}
    await first[1].settle(1, 1)


async def test_a_burst_of_200_admits_exactly_the_concurrency_limit(store: TenantStore, admission):
    key, _ = await make_tenant(store, concurrency=50)
    results = await asyncio.gather(*(admission.admit_key(key, 1, 1) for _ in range(200)), return_exceptions=True)
    tickets = [r[1] for r in results if isinstance(r, tuple)]
    assert all(isinstance(t, Ticket) for t in tickets) and len(tickets) == 50
    assert sum(isinstance(r, QuotaExceeded) for r in results) == 150
    for ticket in tickets:
        await ticket.settle(1, 1)
    assert await admitted(admission, key)


async def test_without_a_channel_the_same_scripts_run_through_redis_py(store: TenantStore, client, prefix):
    key, auth = await make_tenant(store, rpm=5)
    # The Redis server is shared with other test modules (their processes' clients may linger):
    # only connections opened after this point are this test's.
    newest_before = max(int(c["id"]) for c in await client.client_list())
    admission = Admission(client, prefix, pipelined=False)  # what a rediss:// client gets
    try:
        context, ticket = await admission.admit_key(key, 3, 4)
        assert context == auth and ticket.headers["x-ratelimit-remaining-requests"] == "4"
        assert (await ticket.settle(3, 2)).status == "settled"
        assert await admission.admit_key("ps-" + "C" * 43, 1, 1) is None
        opened = [c for c in await client.client_list() if int(c["id"]) > newest_before]
        assert opened == []  # redis-py's pooled connection only: no channel was opened
    finally:
        await admission.aclose()
