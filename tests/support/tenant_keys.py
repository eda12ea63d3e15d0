"""A fresh tenant and one API key for it, in a test's Redis: what end-to-end stacks hand their clients."""

from __future__ import annotations


async def new_tenant_key(redis_url: str, prefix: str, tenant: str, actor: str) -> str:
    from gateway.tenancy import TenantStore, connect

    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=prefix, actor=actor)
        await store.create_tenant(tenant)
        key, _ = await store.create_key(tenant)
        return key
    finally:
        await redis.aclose()
