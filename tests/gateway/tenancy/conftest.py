from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.tenancy import AuthContext, TenantStore, connect
from gateway.tenancy.admission import Admission
from gateway.tenancy.quota import LIMIT_FIELDS
from gateway.tenancy.quota_store import QuotaStore

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
TOKENS = [7042, 314, 17915, 30]  # " Paris is lovely." (what the scripted fake engine answers CHAT with)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test: tests share one redis-server but never each other's keys."""
    return "t" + secrets.token_hex(4)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = connect(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def store(client: aioredis.Redis, prefix: str) -> TenantStore:
    return TenantStore(client, prefix, actor="test")


async def make_tenant(store: TenantStore, name: str = "acme", tier: str = "standard",
                      **limits: int | None) -> tuple[str, AuthContext]:
    """A tenant with one key, its tier defaults replaced by `limits` (every other limit unlimited)."""
    await store.create_tenant(name, tier)
    plaintext, _ = await store.create_key(name)
    changes: dict[str, int | None | str] = {f: None for f in LIMIT_FIELDS}
    changes.update(limits)
    await QuotaStore(store).set(name, None, changes)
    auth = await store.authenticate(plaintext)
    assert auth is not None
    return plaintext, auth


@pytest.fixture
async def admission(client: aioredis.Redis, prefix: str) -> AsyncIterator[Admission]:
    adm = Admission(client, prefix)
    yield adm
    await adm.aclose()


async def make_tenant_at(redis_url: str, prefix: str, **limits: int | None) -> tuple[str, str]:
    """make_tenant's premium tenant acme under `prefix`, from outside any event loop's fixtures: (key, key id)."""
    client = connect(redis_url)
    try:
        key, auth = await make_tenant(TenantStore(client, prefix, actor="test"), "acme", "premium", **limits)
        return key, auth.key_id
    finally:
        await client.aclose()
