"""Two models behind one gateway (issue 42): every route asks the one access decision.

The app is the real one (routes, tenancy store and admission on the session's
redis-server, the real tokenizer) over a fake engine source serving two model
ids; tests/e2e/test_models.py runs the real engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig, ModelsConfig
from gateway.engine_client import EngineDeadError
from gateway.prompts import Prompts
from gateway.served_models import ServedModels
from gateway.state import GatewayState
from gateway.tenancy.admission import Admission
from gateway.tenancy.model_access import Announcement, ModelAccess
from gateway.tenancy.quota_store import QuotaStore
from gateway.tenancy.redis_conn import connect
from gateway.tenancy.store import TenantStore
from tests.gateway.conftest import echo_script
from tests.gateway.fakes import MODEL_INFO, FakeEngine
from tests.support.model_routes import every_model_route

SMALL, TINY = "smollm2", "tiny-llama"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class TwoModels:
    """An engine source with one fake engine per model id, like the replica set's `for_model`."""

    engines: dict[str, FakeEngine]
    down: set[str] = field(default_factory=set)
    """Models whose engine is gone from the live set (registered: 503)."""
    failing: set[str] = field(default_factory=set)
    """Models still announced whose engine fails every submit (the cool-down's case)."""
    failed_tries: dict[str, int] = field(default_factory=dict)
    latest_stats = None
    last_failure = ""

    def announcements(self) -> list[Announcement]:
        return [Announcement(m, True, e.model_info.max_model_len) for m, e in self.engines.items()
                if m not in self.down]

    @property
    def registered(self) -> list[str]:
        return list(self.engines)

    @property
    def client(self) -> TwoModels | None:
        return self if len(self.down) < len(self.engines) else None

    @property
    def model_info(self) -> Any:
        return MODEL_INFO

    @property
    def progressing(self) -> bool:
        return True

    def for_model(self, model_id: str) -> Any:
        engine = self.engines[model_id]
        if model_id in self.down:
            raise EngineDeadError(f"no live engine replica serves {model_id}")
        return _Failing(self, model_id, engine.model_info) if model_id in self.failing else engine

    def fail_open(self, reason: str) -> None:
        pass


@dataclass
class _Failing:
    source: TwoModels
    model_id: str
    model_info: Any

    async def submit(self, request: Any) -> Any:
        self.source.failed_tries[self.model_id] = self.source.failed_tries.get(self.model_id, 0) + 1
        raise EngineDeadError("lost the connection to the engine")


@dataclass
class Harness:
    client: TestClient
    source: TwoModels
    keys: dict[str, str]
    store_args: tuple[str, str]

    def post(self, path: str, body: dict[str, Any], tenant: str) -> Any:
        return self.client.post(path, json=body, headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def get(self, path: str, tenant: str) -> Any:
        return self.client.get(path, headers={"Authorization": f"Bearer {self.keys[tenant]}"})


async def _tenants(redis_url: str, prefix: str) -> dict[str, str]:
    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=prefix, actor="test")
        keys = {}
        for name, models in (("both", ModelAccess.parse("*")), ("small", ModelAccess.of([SMALL])),
                             ("none", ModelAccess.of([]))):
            await store.create_tenant(name, models=models)
            keys[name] = (await store.create_key(name))[0]
        await QuotaStore(store).set("both", None, {"rpm": 3}, model=TINY)
        return keys
    finally:
        await redis.aclose()


@pytest.fixture
def gw(tokenizer: Any, redis_url: str) -> Iterator[Harness]:
    prefix = "m" + uuid.uuid4().hex[:8]
    tiny_info = dataclasses.replace(MODEL_INFO, model_name=TINY, max_model_len=128)
    source = TwoModels({SMALL: FakeEngine(echo_script), TINY: FakeEngine(echo_script, tiny_info)})
    models = ModelsConfig(aliases={"chat": SMALL}, fallbacks={TINY: (SMALL,)}, cooldown_s=60,
                          cost_weights={TINY: 2.0})
    config = GatewayConfig(redis_url=redis_url, redis_prefix=prefix, models=models)

    @contextlib.asynccontextmanager
    async def services(cfg: GatewayConfig) -> AsyncIterator[GatewayState]:
        redis = connect(cfg.redis_url)
        store = TenantStore(redis, prefix=cfg.redis_prefix, actor="test")
        admission = Admission(redis, cfg.redis_prefix)
        prompts = Prompts(tokenizer)
        served = ServedModels({SMALL: prompts, TINY: prompts}, cfg.models)
        try:
            yield GatewayState(cfg, source, prompts, store, store, admission=admission, served=served)
        finally:
            await admission.aclose()
            await redis.aclose()

    keys = asyncio.run(_tenants(redis_url, prefix))
    with TestClient(create_app(config, services)) as client:
        yield Harness(client, source, keys, (redis_url, prefix))


def _ids(r: Any) -> list[str]:
    assert r.status_code == 200, r.text
    return [m["id"] for m in r.json()["data"]]


def test_models_list_shows_exactly_what_the_tenant_may_use(gw: Harness) -> None:
    assert _ids(gw.get("/v1/models", "both")) == [SMALL, TINY]
    assert _ids(gw.get("/v1/models", "small")) == [SMALL]
    assert _ids(gw.get("/v1/models", "none")) == []  # an empty list is no model, never all



def test_a_hidden_model_answers_like_an_absent_one_onevery_model_route(gw: Harness) -> None:
    hidden = every_model_route(gw, TINY, "small")
    absent = every_model_route(gw, "never-served", "both")  # not registered, asked by a tenant allowed all
    assert hidden == [(status, body.replace(b"never-served", TINY.encode())) for status, body in absent]
    assert {status for status, _ in hidden} == {404}
    body = gw.get(f"/v1/models/{TINY}", "small").json()
    assert body == {"error": {"message": f"The model `{TINY}` does not exist or you do not have access to it.",
                              "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    assert not gw.source.engines[TINY].submitted  # nothing reached the hidden model's engine


def test_an_allowed_tenant_uses_both_and_the_response_names_the_served_model(gw: Harness) -> None:
    for requested, served in ((SMALL, SMALL), (TINY, TINY), ("chat", SMALL)):
        r = gw.post("/v1/chat/completions", {**CHAT, "model": requested}, "both")
        assert r.status_code == 200 and r.json()["model"] == served, r.text
    assert len(gw.source.engines[TINY].submitted) == 1 and len(gw.source.engines[SMALL].submitted) == 2


def test_a_tenant_alias_is_its_own_and_never_reaches_past_its_list(gw: Harness, redis_url: str) -> None:
    async def set_aliases() -> None:
        redis = connect(redis_url)
        try:
            store = TenantStore(redis, prefix=gw.store_args[1], actor="test")
            await store.set_aliases("both", {"fast": SMALL, "chat": TINY})  # "chat" overrides the global alias
            await store.set_aliases("small", {"fast": TINY})
        finally:
            await redis.aclose()

    asyncio.run(set_aliases())
    for requested, served in (("fast", SMALL), ("chat", TINY)):
        r = gw.post("/v1/chat/completions", {**CHAT, "model": requested}, "both")
        assert r.status_code == 200 and r.json()["model"] == served, r.text
    r = gw.post("/v1/chat/completions", {**CHAT, "model": "fast"}, "small")  # its alias names a hidden model
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("The model `fast` does not exist")
    assert gw.post("/v1/chat/completions", {**CHAT, "model": "chat"}, "small").json()["model"] == SMALL


def test_a_registered_model_without_a_live_engine_is_503_while_the_other_serves(gw: Harness) -> None:
    gw.source.down.add(TINY)
    gw.source.failing.add(SMALL)  # nor may the fallback answer: its own engine fails
    r = gw.post("/v1/completions", {"model": TINY, "prompt": "hi", "max_tokens": 2}, "small")
    assert r.status_code == 404  # still hidden from a tenant that may not use it
    r = gw.post("/tokenize", {"model": TINY, "prompt": "hi"}, "both")
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    gw.source.failing.clear()
    r = gw.post("/v1/chat/completions", {**CHAT, "model": SMALL}, "small")
    assert r.status_code == 200


def test_a_fallback_answers_at_once_and_the_failed_model_cools_down(gw: Harness) -> None:
    gw.source.failing.add(TINY)
    for _ in range(2):
        r = gw.post("/v1/chat/completions", {**CHAT, "model": TINY}, "both")
        assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
    # the first request tried the failing model once; the second went straight to the fallback
    assert gw.source.failed_tries == {TINY: 1}
    assert len(gw.source.engines[SMALL].submitted) == 2


def test_a_fallback_never_goes_to_a_model_the_tenant_may_not_use(gw: Harness, redis_url: str) -> None:
    async def only_tiny() -> str:
        redis = connect(redis_url)
        try:
            store = TenantStore(redis, prefix=gw.store_args[1], actor="test")
            await store.create_tenant("tiny-only", models=ModelAccess.of([TINY]))
            return (await store.create_key("tiny-only"))[0]
        finally:
            await redis.aclose()

    gw.keys["tiny-only"] = asyncio.run(only_tiny())
    gw.source.down.add(TINY)
    r = gw.post("/v1/chat/completions", {**CHAT, "model": TINY}, "tiny-only")
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
    assert gw.source.engines[SMALL].submitted == []


def test_a_per_model_rpm_refuses_with_its_headers_and_leaves_the_other_model(gw: Harness) -> None:
    for _ in range(3):
        assert gw.post("/v1/chat/completions", {**CHAT, "model": TINY}, "both").status_code == 200
    r = gw.post("/v1/chat/completions", {**CHAT, "model": TINY}, "both")
    assert r.status_code == 429 and f"tenant both on model {TINY}" in r.json()["error"]["message"]
    assert r.headers["x-ratelimit-limit-requests"] == "3" and r.headers["x-ratelimit-remaining-requests"] == "0"
    assert gw.post("/v1/chat/completions", {**CHAT, "model": SMALL}, "both").status_code == 200


def test_the_cost_weight_reaches_the_tenant_budget(gw: Harness, redis_url: str) -> None:
    async def budget(set_limit: bool = False) -> str | None:
        redis = connect(redis_url)
        try:
            if set_limit:
                await QuotaStore(TenantStore(redis, prefix=gw.store_args[1], actor="test")).set(
                    "both", None, {"daily_tokens": 100_000})
            day = time.strftime("%Y%m%d", time.gmtime())
            return await redis.get(f"{gw.store_args[1]}:budget:tenant:both:d:{day}")
        finally:
            await redis.aclose()

    asyncio.run(budget(set_limit=True))
    r = gw.post("/v1/chat/completions", {**CHAT, "model": TINY}, "both")  # --model-cost-weight tiny-llama=2
    weighted = str(2 * r.json()["usage"]["total_tokens"])
    for _ in range(50):  # settlement runs after the response
        if asyncio.run(budget()) == weighted:
            break
        time.sleep(0.05)
    assert asyncio.run(budget()) == weighted


def test_one_model_behind_replicas_answers_to_its_spec_too(tokenizer: Any) -> None:
    """`--model /models/x` with several replicas of x: the spec is an alias of the name the engines report."""
    served = ServedModels({"/models/x": Prompts(tokenizer)})
    source = TwoModels({"x": FakeEngine(echo_script)})
    found = served.resolve("/models/x", ModelAccess.parse("*"), source)
    assert found.id == "x" and found.live
    assert [m.id for m in served.listed(ModelAccess.parse("*"), source)] == ["x"]


def test_a_context_too_long_for_the_model_falls_back_to_a_longer_one(gw: Harness) -> None:
    long_prompt = {"model": TINY, "prompt": [504] * 150, "max_tokens": 4}  # tiny-llama: 128, smollm2: 256
    r = gw.post("/v1/completions", long_prompt, "both")
    assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
    assert gw.source.engines[TINY].submitted == [] and gw.source.failed_tries == {}
    too_long = gw.post("/v1/completions", {**long_prompt, "prompt": [504] * 300}, "both")  # fits neither
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
