"""When and what a response is charged, straight through the ASGI app (real Redis, real tokenizer, the
scripted fake engine): so the test decides when the client hangs up or the socket breaks.

A stream the client cuts is charged for what it was sent; the whole response goes out before settlement,
which happens once and even when sending fails; a bad key's body is never read. The same gateway over
HTTP: test_gateway_quota.py; the settlement arithmetic itself: test_settlement.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from gateway.tenancy import TenantStore, connect
from gateway.tenancy.admission import Admission
from gateway.tenancy.usage import UsageReader, UsageRow
from tests.gateway.fakes import FakeEngine, FakeEngineSource, Script
from tests.gateway.tenancy.conftest import CHAT, TOKENS, make_tenant_at

pytestmark = pytest.mark.anyio
CHAT_8 = json.dumps({**CHAT, "max_tokens": 8}).encode()


async def _asgi_call(state: GatewayState, key: str, body: bytes, send_failure: BaseException | None = None,
                     hang_up_after: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """One request straight through the ASGI app: (messages sent, a log of what happened in order).

    At the send of the final body the log records how many usage rows Redis holds; `send_failure` is
    raised from that send (a socket that broke under it); once the bodies sent so far contain
    `hang_up_after`, the client disconnects."""
    events: list[str] = []
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    received, cut = bytearray(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        events.append("receive")
        if pending:
            return pending.pop(0)
        await cut.wait()  # the client stays connected until it hangs up
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            events.append(f"final body sent, usage rows {len(await _usage(state))}")
            if send_failure is not None:
                raise send_failure
        sent.append(message)
        received.extend(message.get("body", b""))
        if hang_up_after is not None and hang_up_after in received.decode(errors="replace"):
            cut.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers":
             [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json"),
              (b"content-length", str(len(body)).encode())],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("t", 80),
             "client": ("c", 1), "root_path": "", "state": {"gateway": state}}
    try:
        await asyncio.wait_for(create_app(GatewayConfig())(scope, receive, send), 5)
    except OSError as e:  # TimeoutError is one too: only the injected failure may end the call
        if e is not send_failure:
            raise
    return sent, events


async def _usage(state: GatewayState) -> list[UsageRow]:
    assert state.admission is not None
    today = dt.datetime.now(dt.UTC).date()
    return await UsageReader(state.admission.redis, state.admission.prefix).read("tenant", ["acme"], today, today)


@contextlib.asynccontextmanager
async def _state(tokenizer: Any, redis_url: str, engine: FakeEngine | None = None,
                 **limits: int | None) -> AsyncIterator[tuple[GatewayState, str]]:
    """The gateway's state around the fake engine (by default one answering TOKENS), and the key of tenant
    acme with `limits`."""
    prefix = "a" + secrets.token_hex(4)
    key, _ = await make_tenant_at(redis_url, prefix, **limits)
    redis = connect(redis_url)
    store = TenantStore(redis, prefix=prefix, actor="test")
    admission = Admission(redis, prefix=prefix)
    engine = engine or FakeEngine(lambda r: Script([TOKENS] * r.sampling.n))
    try:
        yield GatewayState(GatewayConfig(), FakeEngineSource(engine), Prompts(tokenizer), store, store, admission), key
    finally:
        await admission.aclose()
        await redis.aclose()


async def test_a_stream_cut_by_the_client_is_charged_for_what_was_sent(tokenizer, redis_url):
    engine = FakeEngine(lambda r: Script([TOKENS[:2]], hang=True))
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 200}).encode()
    async with _state(tokenizer, redis_url, engine, output_tpm=1000) as (state, key):
        sent, _ = await _asgi_call(state, key, body, hang_up_after=" is")  # after the second token
        assert any(b"data: " in m.get("body", b"") for m in sent), sent
        row = (await _usage(state))[0]
        assert engine.aborted == [engine.submitted[0].request_id]
        assert (row.requests, row.completion_tokens) == (1, 2)
        assert row.prompt_tokens == len(engine.submitted[0].prompt_token_ids)
        # the 198 reserved-but-unsent output tokens went back to the per-minute bucket
        assert state.admission is not None
        bucket = f"{state.admission.prefix}:rl:tenant:acme"
        assert int(float(await state.admission.redis.hget(bucket, "out"))) >= 1000 - 2


async def test_a_large_body_with_a_bad_key_is_never_read(tokenizer, redis_url):
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 20_000}]}).encode()
    async with _state(tokenizer, redis_url) as (state, _):
        sent, events = await _asgi_call(state, "ps-" + "x" * 43, big)
    assert sent[0]["status"] == 401 and "receive" not in events


async def test_the_whole_response_is_sent_before_settlement_which_happens_once(tokenizer, redis_url):
    async with _state(tokenizer, redis_url, concurrency=1) as (state, key):
        first, events = await _asgi_call(state, key, CHAT_8)
        assert first[0]["status"] == 200 and "final body sent, usage rows 0" in events  # not settled yet ...
        assert len(await _usage(state)) == 1  # ... and settled by the time the request is over
        second, events = await _asgi_call(state, key, CHAT_8)  # concurrency 1: the first one's slot is free
        assert second[0]["status"] == 200
        rows = await _usage(state)
    completion = json.loads(b"".join(m.get("body", b"") for m in second[1:]))["usage"]["completion_tokens"]
    assert (rows[0].requests, rows[0].completion_tokens) == (2, 2 * completion)


async def test_settlement_happens_even_when_sending_the_response_fails(tokenizer, redis_url):
    async with _state(tokenizer, redis_url, concurrency=1) as (state, key):
        _, events = await _asgi_call(state, key, CHAT_8, send_failure=OSError("broken pipe"))
        assert "final body sent, usage rows 0" in events
        rows = await _usage(state)
        after, _ = await _asgi_call(state, key, CHAT_8)  # its concurrency slot was released too
    assert rows[0].requests == 1 and after[0]["status"] == 200
