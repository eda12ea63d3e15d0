from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.tenancy import TenantStore, connect


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
