from __future__ import annotations

import asyncio

import pytest

from gateway.tenancy import InvalidArgument, KeyNotFound, TenantExists, TenantNotFound, TenantStore
from gateway.tenancy.keys import hash_key
from gateway.tenancy.tiers import TIERS

pytestmark = pytest.mark.anyio


async def test_create_key_then_authenticate_gives_the_tenant_context(store: TenantStore):
    tenant = await store.create_tenant("acme", tier="premium")
    plaintext, key = await store.create_key("acme", label="ci")
    assert plaintext.startswith("ps-") and len(plaintext) > 40
    auth = await store.authenticate(plaintext)
    assert auth is not None
    assert (auth.tenant, auth.tenant_id, auth.key_id, auth.tier) == ("acme", tenant.id, key.id, "premium")
    assert (auth.priority, auth.weight) == (TIERS["premium"].priority, TIERS["premium"].weight)
    assert auth.cache_salt == tenant.cache_salt and len(auth.cache_salt) == 32


async def test_tiers_map_to_distinct_priorities_and_weights(store: TenantStore):
    contexts = {}
    for tier in ("free", "standard", "premium"):
        await store.create_tenant(f"t-{tier}", tier=tier)
        plaintext, _ = await store.create_key(f"t-{tier}")
        contexts[tier] = await store.authenticate(plaintext)
    assert contexts["premium"].priority < contexts["standard"].priority < contexts["free"].priority
    assert contexts["premium"].weight > contexts["standard"].weight > contexts["free"].weight


async def test_only_the_hash_of_a_key_is_stored(store: TenantStore, client, prefix):
    plaintext, key = await store.create_key((await store.create_tenant("acme")).name)
    dump = []
    async for name in client.scan_iter(match=f"{prefix}:*"):
        dump.append(name)
        kind = await client.type(name)
        if kind == "hash":
            dump.extend(x for kv in (await client.hgetall(name)).items() for x in kv)
        elif kind == "string":
            dump.append(await client.get(name))
        elif kind == "set":
            dump.extend(await client.smembers(name))
        elif kind == "stream":
            dump.extend(str(e) for e in await client.xrange(name))
    blob = "\n".join(dump)
    assert plaintext not in blob and plaintext[3:] not in blob
    assert hash_key(plaintext) in blob


@pytest.mark.parametrize("token", ["", "nope", "ps-short", "Bearer ps-xxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                                   "ps-" + "A" * 43])
async def test_unknown_or_malformed_keys_do_not_authenticate(store: TenantStore, token: str):
    await store.create_tenant("acme")
    await store.create_key("acme")
    assert await store.authenticate(token) is None


async def test_revoked_key_stops_at_once_and_others_keep_working(store: TenantStore):
    await store.create_tenant("acme")
    k1, info1 = await store.create_key("acme")
    k2, _ = await store.create_key("acme")
    revoked = await store.revoke_key(info1.id)
    assert revoked.status == "revoked" and not revoked.usable()
    assert await store.authenticate(k1) is None
    assert await store.authenticate(k2) is not None


async def test_suspension_blocks_every_key_and_resume_restores_them(store: TenantStore):
    await store.create_tenant("acme")
    k1, _ = await store.create_key("acme")
    k2, _ = await store.create_key("acme")
    assert (await store.suspend_tenant("acme")).status == "suspended"
    assert await store.authenticate(k1) is None and await store.authenticate(k2) is None
    await store.resume_tenant("acme")
    assert await store.authenticate(k1) is not None and await store.authenticate(k2) is not None


async def test_rotation_keeps_the_old_key_for_the_grace_period_only(store: TenantStore):
    await store.create_tenant("acme")
    old, old_info = await store.create_key("acme", label="prod")
    new, new_info = await store.rotate_key(old_info.id, grace_s=0.4)
    assert new != old and new_info.label == "prod"
    assert (await store.authenticate(old)).key_id == old_info.id
    assert (await store.authenticate(new)).key_id == new_info.id
    rotated = await store.get_key(old_info.id)
    assert rotated.rotated_to == new_info.id and rotated.expires_at is not None
    await asyncio.sleep(0.6)
    assert await store.authenticate(old) is None
    assert await store.authenticate(new) is not None
    assert not (await store.get_key(old_info.id)).usable()
    with pytest.raises(InvalidArgument):
        await store.rotate_key(old_info.id)


async def test_rotation_with_zero_grace_revokes_immediately(store: TenantStore):
    await store.create_tenant("acme")
    old, info = await store.create_key("acme")
    await store.rotate_key(info.id, grace_s=0)
    assert await store.authenticate(old) is None


async def test_delete_tenant_removes_keys_and_a_recreated_name_does_not_inherit_them(store: TenantStore):
    await store.create_tenant("acme")
    old, _ = await store.create_key("acme")
    await store.delete_tenant("acme")
    assert await store.authenticate(old) is None
    with pytest.raises(TenantNotFound):
        await store.get_tenant("acme")
    await store.create_tenant("acme")
    assert await store.authenticate(old) is None
    assert await store.list_keys("acme") == []


async def test_typed_errors_for_bad_admin_input(store: TenantStore):
    await store.create_tenant("acme")
    with pytest.raises(TenantExists):
        await store.create_tenant("acme")
    with pytest.raises(InvalidArgument, match="tier"):
        await store.create_tenant("other", tier="gold")
    for bad in ("", "has space", "a:b", "x" * 65):
        with pytest.raises(InvalidArgument):
            await store.create_tenant(bad)
    with pytest.raises(TenantNotFound):
        await store.create_key("ghost")
    with pytest.raises(TenantNotFound):
        await store.delete_tenant("ghost")
    with pytest.raises(KeyNotFound):
        await store.revoke_key("key_missing")


async def test_concurrent_creates_of_one_name_yield_exactly_one_tenant(store: TenantStore):
    results = await asyncio.gather(*(store.create_tenant("race") for _ in range(20)), return_exceptions=True)
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, TenantExists) for r in results if isinstance(r, Exception))


async def test_listings_and_audit_log(store: TenantStore):
    await store.create_tenant("b")
    await store.create_tenant("a", tier="free")
    plaintext, key = await store.create_key("a", label="x")
    await store.suspend_tenant("b")
    assert [(t.name, t.tier, t.status) for t in await store.list_tenants()] == [
        ("a", "free", "active"), ("b", "standard", "suspended")]
    assert [k.id for k in await store.list_keys("a")] == [key.id]
    entries = await store.audit.read()
    assert [e.action for e in entries] == ["tenant.create", "tenant.create", "key.create", "tenant.suspend"]
    assert all(e.actor == "test" for e in entries)
    assert plaintext not in repr([e.to_dict() for e in entries])
