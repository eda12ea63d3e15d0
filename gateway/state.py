"""What the lifespan owns and every route reads: built once per app, never global.

`GatewayState` holds the engine link, the tokenizer, the tenancy store and the
Redis pool. `open_services(config)` builds the real ones and tears them down in
reverse; unit tests pass their own factory with fakes to `create_app`. It knows
nothing about routes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request

from gateway.auth import KeyStore
from gateway.config import GatewayConfig
from gateway.errors import EngineUnavailable
from gateway.generation import Engine
from gateway.prompts import Prompts
from gateway.recent_keys import RecentKeys
from gateway.served_models import ServedModels
from gateway.tenancy.admission import Admission
from gateway.tenancy.outage_policy import OutagePolicy
from shared.model_info import ModelInfo
from shared.protocol import Stats


class EngineHandle(Engine, Protocol):
    """A connected engine client (`EngineClient`)."""

    @property
    def model_info(self) -> ModelInfo: ...
    async def stats(self, timeout: float = 5.0) -> Stats: ...


class EngineSource(Protocol):
    """Where the current engine client comes from (`EngineLink`)."""

    @property
    def client(self) -> EngineHandle | None: ...
    @property
    def progressing(self) -> bool:
        """Connected, and the engine's loop made progress within the stall time."""
        ...
    @property
    def latest_stats(self) -> Stats | None: ...
    @property
    def last_failure(self) -> str: ...
    def fail_open(self, reason: str) -> None:
        """End every open request of this gateway with `reason`."""
        ...


class HealthCheck(Protocol):
    async def ping(self) -> bool: ...


@dataclass(frozen=True)
class GatewayState:
    config: GatewayConfig
    engine: EngineSource
    prompts: Prompts
    store: KeyStore
    redis: HealthCheck
    """Anything with `async ping() -> bool` (the tenancy store's Redis check)."""
    admission: Admission | None = None
    """Quota admission over the same Redis pool; None runs without quotas (unit tests)."""
    started_at: int = field(default_factory=lambda: int(time.time()))
    """The model object's `created` (the same on every call, as OpenAI's is)."""
    recent_keys: RecentKeys = field(default_factory=RecentKeys)
    """Keys (hashes) verified in the last seconds: the key check before the body skips Redis for them."""
    outage: OutagePolicy = field(default_factory=OutagePolicy)
    """What admission does while Redis is down: fail closed, or serve chosen tenants without quotas."""
    served: ServedModels | None = None
    """The models behind the gateway, their tokenizers and fallbacks; None: `prompts` for the one model."""

    def __post_init__(self) -> None:
        if self.served is None:  # one model (unit tests, a single engine): its spec names it
            object.__setattr__(self, "served", ServedModels({self.config.model: self.prompts}))

    @property
    def models(self) -> ServedModels:
        assert self.served is not None
        return self.served

    def engine_client(self) -> EngineHandle:
        """The live engine client, or a 503 for this request."""
        client = self.engine.client
        if client is None:
            raise EngineUnavailable("the engine is not reachable; retry shortly", code="engine_unavailable")
        return client


def get_state(request: Request) -> GatewayState:
    state: Any = request.state.gateway
    assert isinstance(state, GatewayState)
    return state


async def load_served_models(config: GatewayConfig, first: Prompts) -> ServedModels:
    """Every configured model's tokenizer, keyed by the name its engine reports (the spec is an alias)."""
    from shared.model_store import resolve_model

    specs = (config.model, *config.models.extra)
    names = {spec: resolve_model(spec).name for spec in specs}
    tables = {names[config.model]: first}
    for spec in config.models.extra:
        tables[names[spec]] = await Prompts.load(spec)
    return ServedModels(tables, config.models, spec_aliases=names)


@contextlib.asynccontextmanager
async def open_services(config: GatewayConfig) -> AsyncIterator[GatewayState]:
    """The real services: tokenizer, Redis pool + tenancy store, engine link (waits for the engine)."""
    from gateway.engine_link import EngineLink
    from gateway.replicas import open_replicas
    from gateway.replicas.replica_set import ReplicaSet
    from gateway.tenancy.redis_conn import connect
    from gateway.tenancy.store import TenantStore

    prompts = await Prompts.load(config.model)
    served = None
    if config.models.extra or config.models.aliases or config.models.fallbacks:
        served = await load_served_models(config, prompts)
    redis = connect(config.redis_url, timeout_s=config.redis_timeout_s, max_connections=config.redis_max_connections,
                    pool_wait_s=config.redis_pool_wait_s)
    store = TenantStore(redis, prefix=config.redis_prefix, actor="gateway")
    admission = Admission(redis, prefix=config.redis_prefix, config=config.admission)
    from shared.curve import client_keys

    curve = None if config.engine_curve_dir is None else client_keys(config.engine_curve_dir)
    link: EngineLink | ReplicaSet = (
        open_replicas(config.replicas, redis, config.redis_prefix) if config.replicas.enabled
        else EngineLink(config.engine_address, retry_interval_s=config.engine_retry_interval_s,
                        poll_interval_s=config.engine_poll_interval_s, stall_s=config.engine_stall_s, curve=curve))
    try:
        await link.start(config.engine_connect_timeout_s)
        yield GatewayState(config=config, engine=link, prompts=prompts, store=store, redis=store,
                           admission=admission, outage=OutagePolicy(fail_open=config.redis_down_fail_open),
                           served=served)
    finally:
        await admission.aclose()
        await link.close()
        await redis.aclose()
