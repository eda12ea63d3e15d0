"""Quotas through the real gateway app: real Redis, real tokenizer, the scripted fake engine.

What the HTTP client sees (429 bodies and headers, x-ratelimit-* on success,
503 when Redis is gone) and what Redis records (usage = exactly the tokens the
client was sent; cut streams and when settlement happens: test_response_settlement.py).
The e2e suite runs the real engine; here the engine is `tests/gateway/fakes.FakeEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from gateway.tenancy import TenantStore, connect
from gateway.tenancy.admission import Admission, AdmissionConfig
from gateway.tenancy.usage import UsageReader, UsageRow
from tests.gateway.fakes import FakeEngine, FakeEngineSource, Script
from tests.gateway.tenancy.conftest import CHAT, TOKENS, make_tenant_at
from tests.gateway.tenancy.restartable_redis import RestartableRedis

ADMIN_TOKEN = "test-admin-token"


@dataclass
class Gateway:
    client: TestClient
    engine: FakeEngine
    redis_url: str
    prefix: str
    key: str
    key_id: str

    def chat(self, key: str | None = None, **body: Any) -> Any:
        return self.client.post("/v1/chat/completions", json={**CHAT, **body},
                                headers={"Authorization": f"Bearer {key or self.key}"})

    def usage(self) -> UsageRow | None:
        async def read() -> list[UsageRow]:
            client = connect(self.redis_url)
            try:
                today = dt.datetime.now(dt.UTC).date()
                return await UsageReader(client, self.prefix).read("tenant", ["acme"], today, today)
            finally:
                await client.aclose()

        rows = asyncio.run(read())
        return rows[0] if rows else None


def services_with_admission(engine: FakeEngine, tokenizer: Any,
                            admission_config: AdmissionConfig | None = None) -> Callable[[GatewayConfig], Any]:
    @contextlib.asynccontextmanager
    async def services(cfg: GatewayConfig) -> AsyncIterator[GatewayState]:
        redis = connect(cfg.redis_url)
        store = TenantStore(redis, prefix=cfg.redis_prefix, actor="gateway")
        admission = Admission(redis, prefix=cfg.redis_prefix, config=admission_config)
        try:
            yield GatewayState(cfg, FakeEngineSource(engine), Prompts(tokenizer), store, store, admission)
        finally:
            await admission.aclose()
            await redis.aclose()

    return services


@pytest.fixture
def make_gateway(tokenizer: Any, redis_url: str) -> Iterator[Callable[..., Gateway]]:
    stack = contextlib.ExitStack()

    def build(script: Callable[[Any], Script] = lambda r: Script([TOKENS] * r.sampling.n),
              url: str | None = None, admission_config: AdmissionConfig | None = None,
              **limits: int | None) -> Gateway:
        url = url or redis_url
        prefix = "g" + secrets.token_hex(4)
        engine = FakeEngine(script)
        key, key_id = asyncio.run(make_tenant_at(url, prefix, **limits))
        config = GatewayConfig(redis_url=url, redis_prefix=prefix, admin_token=ADMIN_TOKEN)
        services = services_with_admission(engine, tokenizer, admission_config)
        client = stack.enter_context(TestClient(create_app(config, services)))
        return Gateway(client, engine, url, prefix, key, key_id)

    yield build
    stack.close()


def test_requests_over_the_limit_get_429_with_openai_body_and_headers(make_gateway):
    gw = make_gateway(rpm=2)
    ok = [gw.chat(max_tokens=8) for _ in range(2)]
    assert [r.status_code for r in ok] == [200, 200]
    assert ok[1].headers["x-ratelimit-limit-requests"] == "2"
    assert ok[1].headers["x-ratelimit-remaining-requests"] == "0"
    assert ok[1].headers["x-ratelimit-reset-requests"].endswith("s")
    refused = gw.chat(max_tokens=8)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "requests per minute" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1 and int(refused.headers["retry-after-ms"]) > 0
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(gw.engine.submitted) == 2  # a refused request never reaches the engine


def test_streams_carry_the_headers_and_a_missing_max_tokens_reserves_the_default_cap(make_gateway):
    gw = make_gateway(admission_config=AdmissionConfig(default_max_tokens=50), output_tpm=1000)
    streamed = gw.chat(stream=True)  # no max_tokens: the gateway allows the context's room (> 50)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert streamed.headers["x-ratelimit-limit-tokens"] == "1000"
    assert streamed.headers["x-ratelimit-remaining-tokens"] == "950"
    assert gw.engine.submitted[0].sampling.max_tokens > 50
    given = gw.chat(max_tokens=200, n=2)
    assert 1000 - 50 - 400 <= int(given.headers["x-ratelimit-remaining-tokens"]) <= 1000 - 400  # + refunds


def test_exhausted_budget_is_insufficient_quota(make_gateway):
    gw = make_gateway(daily_tokens=60)
    assert gw.chat(max_tokens=10).status_code == 200  # reserves prompt + 10, settles to prompt + 4
    refused = gw.chat(max_tokens=40)
    assert refused.status_code == 429
    assert (refused.json()["error"]["type"], refused.json()["error"]["code"]) == ("tokens", "insufficient_quota")


def test_tier_reaches_the_engine_as_priority_weight_and_salt(make_gateway):
    gw = make_gateway()
    assert gw.chat(max_tokens=4).status_code == 200
    sent = gw.engine.submitted[0]
    assert (sent.priority, sent.weight) == (0, 4.0)  # premium
    assert sent.tenant_id.startswith("t_") and len(sent.cache_salt) == 32


def test_usage_is_exactly_what_each_client_was_sent(make_gateway):
    gw = make_gateway(script=lambda r: Script([TOKENS] * r.sampling.n, reason="stop"))
    whole = gw.chat(max_tokens=50).json()["usage"]
    lines = gw.chat(max_tokens=50, stream=True, stream_options={"include_usage": True}).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    streamed = chunks[-1]["usage"]
    stopped = gw.chat(max_tokens=50, stop=[" is"]).json()  # stop string after the first token
    assert stopped["choices"][0]["message"]["content"] == " Paris"
    n2 = gw.chat(max_tokens=50, n=2).json()["usage"]
    row = gw.usage()
    sent = [whole, streamed, stopped["usage"], n2]
    assert row.requests == 4
    assert row.prompt_tokens == sum(u["prompt_tokens"] for u in sent)
    assert row.completion_tokens == sum(u["completion_tokens"] for u in sent) == 4 + 4 + 2 + 8
    assert row.errors == 0


def test_engine_failure_mid_stream_counts_an_error_and_the_tokens_sent(make_gateway):
    gw = make_gateway(script=lambda r: Script([TOKENS[:2]], fail=RuntimeError("boom")))
    body = gw.chat(max_tokens=50, stream=True).text
    assert '"error"' in body
    row = gw.usage()
    assert (row.requests, row.completion_tokens, row.errors) == (1, 2, 1)


def test_refused_and_unauthenticated_requests_leave_keys_out_of_logs(make_gateway, caplog):
    gw = make_gateway(rpm=1)
    caplog.set_level(logging.DEBUG)
    wrong = "ps-" + "x" * 43
    responses = [gw.chat(max_tokens=4), gw.chat(max_tokens=4), gw.chat(key=wrong)]
    texts = [r.text for r in responses]
    # status codes, not "429" in the body: a random request id (hex) contains "429" about once in 140 runs
    assert [r.status_code for r in responses] == [200, 429, 401]
    assert '"rate_limit_exceeded"' in texts[1] and "invalid_api_key" in texts[2]
    everything = "\n".join(texts) + "\n".join(r.getMessage() for r in caplog.records)
    assert gw.key not in everything and wrong not in everything


def test_admin_routes_are_mounted_behind_the_admin_token(make_gateway):
    gw = make_gateway()
    assert gw.client.get("/admin/tenants").status_code == 401
    r = gw.client.get("/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200 and [t["name"] for t in r.json()] == ["acme"]
    r = gw.client.post("/admin/tenants/acme/suspend", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200
    assert gw.chat(max_tokens=4).status_code == 401  # suspension takes effect at once


def test_redis_outage_is_503_and_service_resumes_by_itself(make_gateway):
    server = RestartableRedis()
    server.start()
    try:
        gw = make_gateway(url=server.url)
        assert gw.chat(max_tokens=4).status_code == 200
        server.stop()
        down = gw.chat(max_tokens=4)
        assert down.status_code == 503 and "unavailable" in down.json()["error"]["message"]
        health = gw.client.get("/health")
        assert health.status_code == 503 and health.json()["redis"]["healthy"] is False
        server.start()
        assert gw.chat(max_tokens=4).status_code == 200
        assert gw.client.get("/health").json()["redis"]["healthy"] is True
    finally:
        server.close()


def _admin(gw: Gateway, action: Callable[[TenantStore], Any]) -> Any:
    """Run one admin operation against the gateway's Redis, as the CLI would from another process."""
    async def run() -> Any:
        client = connect(gw.redis_url)
        try:
            return await action(TenantStore(client, gw.prefix, actor="test"))
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_revocation_and_suspension_hold_from_the_very_next_request(make_gateway):
    gw = make_gateway()
    other, info = _admin(gw, lambda s: s.create_key("acme"))
    assert gw.chat(key=other, max_tokens=4).status_code == 200
    _admin(gw, lambda s: s.revoke_key(info.id))
    refused = gw.chat(key=other, max_tokens=4)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert gw.chat(max_tokens=4).status_code == 200
    _admin(gw, lambda s: s.suspend_tenant("acme"))
    assert gw.chat(max_tokens=4).status_code == 401
    _admin(gw, lambda s: s.resume_tenant("acme"))
    assert gw.chat(max_tokens=4).status_code == 200
    assert len(gw.engine.submitted) == 3


def test_rotation_grace_keeps_the_old_key_and_zero_grace_ends_it_at_once(make_gateway):
    gw = make_gateway()
    new, _ = _admin(gw, lambda s: s.rotate_key(gw.key_id, grace_s=60))
    assert gw.chat(max_tokens=4).status_code == 200 and gw.chat(key=new, max_tokens=4).status_code == 200
    new_id = _admin(gw, lambda s: s.authenticate(new)).key_id
    newer, _ = _admin(gw, lambda s: s.rotate_key(new_id, grace_s=0))
    assert gw.chat(key=new, max_tokens=4).status_code == 401
    assert gw.chat(key=newer, max_tokens=4).status_code == 200


def test_a_bad_key_is_told_401_before_any_other_refusal_and_charged_nothing(make_gateway):
    gw = make_gateway(rpm=1)
    wrong = "ps-" + "x" * 43
    bodies = [{"model": "nope"}, {"max_tokens": -1}, {"max_tokens": 10**6}, {"messages": []}]
    for key, expected in ((wrong, {401}), (gw.key, {400, 404})):
        for body in bodies:
            r = gw.chat(key=key, **body)
            assert r.status_code in expected, (body, r.status_code, r.text)
        r = gw.client.post("/v1/chat/completions", content=b"{not json",
                           headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
        assert r.status_code in expected
    assert gw.engine.submitted == [] and gw.usage() is None
    ok = gw.chat(max_tokens=4)  # the one request a minute was spent on none of the refusals above
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "0"
    assert gw.chat(key=wrong, max_tokens=4).status_code == 401  # quota spent: a bad key still hears 401


def test_a_dead_engine_is_503_for_a_good_key_and_401_for_a_bad_one(make_gateway):
    gw = make_gateway()
    gw.engine.dead = True
    assert gw.chat(key="ps-" + "x" * 43, max_tokens=4).status_code == 401
    assert gw.chat(max_tokens=4).status_code == 503


