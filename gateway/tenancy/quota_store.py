"""Quota overrides in Redis: what `quota set|show` change and what admission reads.

    P:quota:tenant:{name}     hash  field -> limit (-1 = unlimited); absent field = tier default
    P:quota:key:{key_id}      hash  field -> limit (-1 = unlimited); absent field = no key limit

The admission script reads these hashes itself on every request, so a change
takes effect on the next request at every gateway. Changes are audited.
"""

from __future__ import annotations

from gateway.tenancy.errors import InvalidArgument
from gateway.tenancy.quota import UNLIMITED, Quota, decode_overrides, merge
from gateway.tenancy.redis_conn import text_dict, unavailable_on_failure
from gateway.tenancy.store import TenantStore
from gateway.tenancy.tiers import get_tier


def tenant_quota_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:quota:tenant:{tenant}"


def key_quota_key(prefix: str, key_id: str) -> str:
    return f"{prefix}:quota:key:{key_id}"


class QuotaStore:
    def __init__(self, store: TenantStore) -> None:
        self.store = store
        self.redis = store.redis
        self.prefix = store.prefix

    async def _hash_key(self, tenant: str, key_id: str | None) -> str:
        await self.store.get_tenant(tenant)  # raises TenantNotFound
        if key_id is None:
            return tenant_quota_key(self.prefix, tenant)
        info = await self.store.get_key(key_id)  # raises KeyNotFound
        if info.tenant != tenant:
            raise InvalidArgument(f"API key {key_id!r} belongs to another tenant")
        return key_quota_key(self.prefix, key_id)

    async def set(self, tenant: str, key_id: str | None, changes: dict[str, int | None | str]) -> None:
        """changes: field -> int limit, None for unlimited, or "default" to drop the override."""
        hkey = await self._hash_key(tenant, key_id)
        to_set = {f: UNLIMITED if v is None else v for f, v in changes.items() if v != "default"}
        to_drop = [f for f, v in changes.items() if v == "default"]
        with unavailable_on_failure():
            async with self.redis.pipeline(transaction=True) as pipe:
                if to_set:
                    pipe.hset(hkey, mapping=to_set)  # type: ignore[arg-type]
                if to_drop:
                    pipe.hdel(hkey, *to_drop)
                await pipe.execute()
        await self.store.audit.record(self.store.actor, "quota.set", key_id or tenant, tenant=tenant,
                                      **{f: ("unlimited" if v is None else v) for f, v in changes.items()})

    async def overrides(self, tenant: str, key_id: str | None = None) -> dict[str, int | None]:
        hkey = await self._hash_key(tenant, key_id)
        with unavailable_on_failure():
            return decode_overrides(text_dict(await self.redis.hgetall(hkey)))

    async def effective(self, tenant: str, key_id: str | None = None) -> Quota:
        """A tenant's limits (tier defaults + overrides), or a key's own limits (overrides only)."""
        overrides = await self.overrides(tenant, key_id)
        if key_id is not None:
            return merge(Quota(), overrides)
        tier = get_tier((await self.store.get_tenant(tenant)).tier)
        return merge(tier.limits, overrides)
