"""Fixtures for gateway tests: the real tokenizer, and a tiny app around a fake engine.

The app uses the real tokenizer, the real tenancy store on the session's real
redis-server, and `FakeEngine` in place of the engine process (HTTP shape
only; tests/e2e runs the real engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from gateway.tokenizer import TextTokenizer
from shared.model_store import resolve_model
from tests.gateway.fakes import FakeEngine, FakeEngineSource, Script


@pytest.fixture(scope="session")
def tokenizer() -> TextTokenizer:
    """The gateway's own tokenizer of the default model (test_tokenizer.py checks it against transformers)."""
    return TextTokenizer.from_folder(resolve_model("smollm2").path)


@dataclass
class GatewayHarness:
    client: TestClient
    engine: FakeEngine
    key: str
    """A working API key of tenant `tenant`."""
    revoked_key: str
    tenant: str
    prefix: str = ""
    """The Redis prefix of this gateway's tenancy data."""

    def post(self, path: str, body: dict[str, Any], key: str | None = None, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return self.client.post(path, json=body, headers=headers, **kw)


def echo_script(request: Any) -> Script:
    """Default: every sample "says" a fixed text (token ids of ' Paris is lovely.')."""
    return Script(samples=[[7042, 314, 17915, 30]] * request.sampling.n)


@pytest.fixture
def make_gateway(tokenizer: Any, redis_url: str) -> Iterator[Callable[..., GatewayHarness]]:
    stack = contextlib.ExitStack()

    def build(script: Callable[[Any], Script] = echo_script, **settings: Any) -> GatewayHarness:
        """`settings`: GatewayConfig fields to change (trusted_request_id, cors_origins ...)."""
        from gateway.tenancy.redis_conn import connect
        from gateway.tenancy.store import TenantStore

        engine = FakeEngine(script)
        prefix = "t" + uuid.uuid4().hex[:8]
        config = GatewayConfig(redis_url=redis_url, redis_prefix=prefix, **settings)

        @contextlib.asynccontextmanager
        async def services(cfg: GatewayConfig) -> AsyncIterator[GatewayState]:
            redis = connect(cfg.redis_url)
            store = TenantStore(redis, prefix=cfg.redis_prefix, actor="test")
            try:
                yield GatewayState(cfg, FakeEngineSource(engine), Prompts(tokenizer), store, store)
            finally:
                await redis.aclose()

        keys = asyncio.run(_make_keys(redis_url, prefix))
        client = stack.enter_context(TestClient(create_app(config, services)))
        return GatewayHarness(client, engine, keys[0], keys[1], "acme", prefix)

    yield build
    stack.close()


async def _make_keys(redis_url: str, prefix: str) -> tuple[str, str]:
    from gateway.tenancy.redis_conn import connect
    from gateway.tenancy.store import TenantStore

    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=prefix, actor="test")
        await store.create_tenant("acme")
        good, _ = await store.create_key("acme")
        revoked, info = await store.create_key("acme")
        await store.revoke_key(info.id)
        return good, revoked
    finally:
        await redis.aclose()
