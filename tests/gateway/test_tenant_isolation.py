"""Tenant isolation at the gateway: a tenant's key reaches no admin route and no other tenant's data,
and every tenant's requests carry their own prefix-cache salt, also tenants whose records lack one.
(The engine's side: tests/engine/scheduling/test_scheduler_prefix.py shares cached blocks only within a salt, and
tests/engine/serving/test_server_loop.py ignores an Abort of another gateway's request.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.tenancy import TenantStore, connect

COMPLETION = {"model": "smollm2", "prompt": "The same prompt for everyone", "max_tokens": 2}
ADMIN_PATHS = [("GET", "/admin/tenants"), ("GET", "/admin/usage?tenant=acme"), ("POST", "/admin/tenants"),
               ("GET", "/admin/tenants/acme/keys")]


async def _second_tenant(redis_url: str, prefix: str, name: str, drop_salts: list[str]) -> str:
    client = connect(redis_url)
    try:
        store = TenantStore(client, prefix=prefix, actor="test")
        await store.create_tenant(name)
        key, _ = await store.create_key(name)
        for tenant in drop_salts:  # records from before salts existed
            await client.hdel(f"{prefix}:tenant:{tenant}", "cache_salt")
        return key
    finally:
        await client.aclose()


@pytest.mark.parametrize("drop_salts", [False, True])
def test_each_tenant_has_its_own_cache_salt(make_gateway: Any, redis_url: str, drop_salts: bool) -> None:
    gw = make_gateway()
    other_key = asyncio.run(_second_tenant(redis_url, gw.prefix, "globex", ["acme", "globex"] if drop_salts else []))
    assert gw.post("/v1/completions", COMPLETION).status_code == 200
    assert gw.post("/v1/completions", COMPLETION, key=other_key).status_code == 200
    mine, theirs = gw.engine.submitted
    assert mine.tenant_id != theirs.tenant_id
    assert mine.cache_salt and theirs.cache_salt and mine.cache_salt != theirs.cache_salt


@pytest.mark.parametrize(("method", "path"), ADMIN_PATHS)
def test_a_tenant_key_reaches_no_admin_route(make_gateway: Any, method: str, path: str) -> None:
    gw = make_gateway()
    r = gw.client.request(method, path, headers={"Authorization": f"Bearer {gw.key}"}, json={})
    assert r.status_code in (401, 404) and gw.key not in r.text


def test_a_missing_salt_is_replaced_by_one_unique_to_the_tenant() -> None:
    from gateway.tenancy.store import auth_context

    a, b = (auth_context("k", tid, "name", "standard", "") for tid in ("t_1", "t_2"))
    assert a.cache_salt and b.cache_salt and a.cache_salt != b.cache_salt
    assert auth_context("k", "t_1", "name", "standard", "s3cret").cache_salt == "s3cret"
