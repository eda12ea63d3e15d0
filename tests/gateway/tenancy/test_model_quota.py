"""Per-tenant per-model limits (issue 42): checked and charged in the same script call as the tenant's own."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from gateway.tenancy import QuotaExceeded, TenantStore, connect
from gateway.tenancy.admission import Admission, Ticket
from gateway.tenancy.model_access import ModelAccess
from gateway.tenancy.quota_store import QuotaStore
from tests.gateway.tenancy.conftest import make_tenant

pytestmark = pytest.mark.anyio

SMALL, BIG = "HuggingFaceTB/SmolLM2-135M-Instruct", "tiny-llama"


async def test_a_model_rpm_admits_exactly_its_allowance_across_two_gateways(store, redis_url, prefix):
    """Two Admission objects on their own connections (two gateways): 200 at once, 50 admitted."""
    key, auth = await make_tenant(store)
    await QuotaStore(store).set("acme", None, {"rpm": 50}, model=BIG)
    clients = [connect(redis_url) for _ in range(2)]
    gateways = [Admission(c, prefix) for c in clients]
    try:
        results = await asyncio.gather(*(gateways[i % 2].admit_key(key, 1, 1, model=BIG) for i in range(200)),
                                       return_exceptions=True)
        admitted = [r for r in results if isinstance(r, tuple)]
        refused = [r for r in results if isinstance(r, QuotaExceeded)]
        assert len(admitted) == 50 and len(refused) == 150, [r for r in results if isinstance(r, Exception)][:2]
        assert "tenant acme on model tiny-llama" in refused[0].message and refused[0].limit == "rpm"
        assert refused[0].headers["x-ratelimit-limit-requests"] == "50"
        # the other model and the tenant-wide scope are not limited by it
        other = await gateways[1].admit_key(key, 1, 1, model=SMALL)
        assert other is not None
        for _, ticket in [*admitted, other]:
            await ticket.settle(1, 1)
    finally:
        for g in gateways:
            await g.aclose()
        for c in clients:
            await c.aclose()


async def test_the_model_limit_and_the_tenant_limit_bind_together(store, admission):
    _, auth = await make_tenant(store, rpm=5)
    await QuotaStore(store).set("acme", None, {"concurrency": 2}, model=SMALL)
    held = [await admission.admit(auth, 1, 1, model=SMALL) for _ in range(2)]
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1, 1, model=SMALL)
    assert info.value.limit == "concurrency" and f"on model {SMALL}" in info.value.message
    held += [await admission.admit(auth, 1, 1, model=BIG) for _ in range(3)]  # tenant rpm 5 used up
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1, 1, model=BIG)
    assert "tenant acme" in info.value.message and "model" not in info.value.message
    for t in held:
        await t.settle(1, 1)
    # settling released the model's concurrency slots (the tenant's rpm is spent: lift it)
    await QuotaStore(store).set("acme", None, {"rpm": None})
    again = [await admission.admit(auth, 1, 1, model=SMALL) for _ in range(2)]
    for t in again:
        await t.settle(1, 1)


async def test_settlement_records_usage_per_model_and_refunds_its_budget(store, admission, client, prefix):
    _, auth = await make_tenant(store)
    await QuotaStore(store).set("acme", None, {"daily_tokens": 100}, model=BIG)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    ticket: Ticket = await admission.admit(auth, 10, 50, model=BIG)
    assert await client.get(f"{prefix}:budget:model:acme:{BIG}:d:{day}") == "60"
    await ticket.settle(10, 7, cached_tokens=4)
    assert await client.get(f"{prefix}:budget:model:acme:{BIG}:d:{day}") == "17"
    usage = await client.hgetall(f"{prefix}:usage:model:acme:{BIG}:{day}")
    assert usage == {"requests": "1", "prompt_tokens": "10", "completion_tokens": "7", "cached_tokens": "4"}
    assert not await client.exists(f"{prefix}:usage:model:acme:{SMALL}:{day}")
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 10, 80, model=BIG)
    assert info.value.limit == "daily_tokens"


async def test_admit_key_carries_the_tenant_model_list(store: TenantStore, admission: Admission):
    await store.create_tenant("only-small", "standard", ModelAccess.of([SMALL]))
    key, _ = await store.create_key("only-small")
    admitted = await admission.admit_key(key, 1, 1, model=SMALL)
    assert admitted is not None and admitted[0].models == ModelAccess.of([SMALL])
    await admitted[1].settle(1, 1)
    await store.create_tenant("legacy")
    await store.redis.hdel(f"{store.prefix}:tenant:legacy", "models")  # written before model lists
    key, _ = await store.create_key("legacy")
    auth = await store.authenticate(key)
    assert auth is not None and auth.models.everything
    assert (await store.get_tenant("legacy")).to_dict()["models"] == ["*"]
    shown = (await store.set_models("legacy", ModelAccess.of([]))).to_dict()["models"]
    assert shown == [] and not (await store.authenticate(key)).models.permits(SMALL)  # type: ignore[union-attr]


async def test_deleting_the_tenant_removes_its_model_limits(store, client, prefix):
    await make_tenant(store)
    await QuotaStore(store).set("acme", None, {"rpm": 3}, model=BIG)
    assert await QuotaStore(store).overrides("acme", model=BIG) == {"rpm": 3}
    await store.delete_tenant("acme")
    assert await client.keys(f"{prefix}:quota:*") == []


async def test_a_cost_weight_scales_the_tenant_budget_not_the_model_scope_or_usage(store, admission, client, prefix):
    _, auth = await make_tenant(store, daily_tokens=1000, output_tpm=500)
    await QuotaStore(store).set("acme", None, {"daily_tokens": 1000}, model=BIG)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    ticket = await admission.admit(auth, 10, 90, model=BIG, weight=4.0)  # 100 tokens of the large model
    assert await client.get(f"{prefix}:budget:tenant:acme:d:{day}") == "400"
    assert await client.get(f"{prefix}:budget:model:acme:{BIG}:d:{day}") == "100"
    assert ticket.headers["x-ratelimit-remaining-tokens"] == "140"  # output bucket: 500 - 90 x 4
    await ticket.settle(10, 40)  # 50 used: 200 weighted tokens on the tenant, 50 on the model
    assert await client.get(f"{prefix}:budget:tenant:acme:d:{day}") == "200"
    assert await client.get(f"{prefix}:budget:model:acme:{BIG}:d:{day}") == "50"
    usage = await client.hgetall(f"{prefix}:usage:tenant:acme:{day}")
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == ("10", "40")  # usage is what was sent
    with pytest.raises(QuotaExceeded) as info:  # 130 output tokens x 4 = 520, over the 500 output_tpm
        await admission.admit(auth, 0, 130, model=BIG, weight=4.0)
    assert info.value.limit == "output_tpm" and "tenant acme" in info.value.message
    small = await admission.admit(auth, 0, 30, model=SMALL, weight=0.1)
    assert await client.get(f"{prefix}:budget:tenant:acme:d:{day}") == "203"
    await small.settle(0, 0)
