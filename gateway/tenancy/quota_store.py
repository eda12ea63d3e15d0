"""Quota overrides in Redis: what `quota set|show` change and what admission reads.

    P:quota:tenant:{name}     hash  field -> limit (-1 = unlimited); absent field = tier default
    P:quota:key:{key_id}      hash  field -> limit (-1 = unlimited); absent field = no key limit
    P:quota:model:{name}:{model}  hash  the tenant's limits on one model (issue 42); absent = none
    P:quota:models:{name}     set   the models with such a hash (so deleting the tenant removes them)

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


def model_quota_key(prefix: str, tenant: str, model: str) -> str:
    """The tenant-on-one-model limits the admission script reads (its scope "model:{tenant}:{model}")."""
    return f"{prefix}:quota:model:{tenant}:{model}"


def model_index_key(prefix: str, tenant: str) -> str:
    return f"{prefix}:quota:models:{tenant}"


class QuotaStore:
    def __init__(self, store: TenantStore) -> None:
        self.store = store
        self.redis = store.redis
        self.prefix = store.prefix

    async def _hash_key(self, tenant: str, key_id: str | None, model: str | None = None) -> str:
        await self.store.get_tenant(tenant)  # raises TenantNotFound
        if model is not None:
            if key_id is not None or not model:
                raise InvalidArgument("a per-model limit is set for a tenant and a model id, not for a key")
            return model_quota_key(self.prefix, tenant, model)
        if key_id is None:
            return tenant_quota_key(self.prefix, tenant)
        info = await self.store.get_key(key_id)  # raises KeyNotFound
        if info.tenant != tenant:
            raise InvalidArgument(f"API key {key_id!r} belongs to another tenant")
        return key_quota_key(self.prefix, key_id)

    async def set(self, tenant: str, key_id: str | None, changes: dict[str, int | None | str],
                  model: str | None = None) -> None:
        """changes: field -> int limit, None for unlimited, or "default" to drop the override.
        With `model`: the tenant's limits on that model id, beside its tenant-wide ones."""
        hkey = await self._hash_key(tenant, key_id, model)
        to_set = {f: UNLIMITED if v is None else v for f, v in changes.items() if v != "default"}
        to_drop = [f for f, v in changes.items() if v == "default"]
        with unavailable_on_failure():
            async with self.redis.pipeline(transaction=True) as pipe:
                if to_set:
                    pipe.hset(hkey, mapping=to_set)  # type: ignore[arg-type]
                if to_drop:
                    pipe.hdel(hkey, *to_drop)
                if model is not None:
                    pipe.sadd(model_index_key(self.prefix, tenant), model)
                await pipe.execute()
        await self.store.audit.record(self.store.actor, "quota.set", key_id or tenant, tenant=tenant,
                                      **({"model": model} if model is not None else {}),
                                      **{f: ("unlimited" if v is None else v) for f, v in changes.items()})

    async def overrides(self, tenant: str, key_id: str | None = None,
                        model: str | None = None) -> dict[str, int | None]:
        hkey = await self._hash_key(tenant, key_id, model)
        with unavailable_on_failure():
            return decode_overrides(text_dict(await self.redis.hgetall(hkey)))

    async def effective(self, tenant: str, key_id: str | None = None, model: str | None = None) -> Quota:
        """A tenant's limits (tier defaults + overrides), or a key's or a model's own (overrides only)."""
        overrides = await self.overrides(tenant, key_id, model)
        if key_id is not None or model is not None:
            return merge(Quota(), overrides)
        tier = get_tier((await self.store.get_tenant(tenant)).tier)
        return merge(tier.limits, overrides)
