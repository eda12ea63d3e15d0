"""A client that goes away aborts its engine request: streaming and non-streaming.

Driven at the ASGI level (the lifespan state is put into the scope directly) so
the test controls exactly when `http.disconnect` arrives.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.sse import SSEResponse
from gateway.state import GatewayState
from gateway.tenancy.redis_conn import connect
from gateway.tenancy.store import TenantStore
from tests.gateway.fakes import FakeEngine, FakeEngineSource, Script

BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


async def call(tokenizer: Any, redis_url: str, body: dict[str, Any], disconnect_when: str) -> FakeEngine:
    """POST to the app; the client hangs up once `disconnect_when` appears in what it received."""
    engine = FakeEngine(lambda req: Script([[7042, 314]], hang=True))
    redis = connect(redis_url)
    store = TenantStore(redis, prefix="d" + uuid.uuid4().hex[:8], actor="test")
    await store.create_tenant("acme")
    key, _ = await store.create_key("acme")
    state = GatewayState(GatewayConfig(), FakeEngineSource(engine), Prompts(tokenizer), store, store)
    received = bytearray()
    got_text = asyncio.Event()
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await got_text.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        received.extend(message.get("body", b""))
        if disconnect_when in received.decode(errors="replace"):
            got_text.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers":
             [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("t", 80),
             "client": ("c", 1), "root_path": "", "state": {"gateway": state}}
    app = create_app(GatewayConfig())
    if disconnect_when == "":  # non-streaming: hang up once the engine has the request
        async def hang_up_soon() -> None:
            while not engine.submitted:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            got_text.set()
        helper = asyncio.create_task(hang_up_soon())
    await asyncio.wait_for(app(scope, receive, send), 5)
    if disconnect_when == "":
        await helper
    await redis.aclose()
    return engine


def test_stream_cut_by_client_aborts_the_engine_request(tokenizer: Any, redis_url: str) -> None:
    engine = asyncio.run(call(tokenizer, redis_url, {**BODY, "stream": True}, " is"))
    assert engine.aborted == [engine.submitted[0].request_id]


def test_non_streaming_client_gone_aborts_the_engine_request(tokenizer: Any, redis_url: str) -> None:
    engine = asyncio.run(call(tokenizer, redis_url, BODY, ""))
    assert engine.aborted == [engine.submitted[0].request_id]


def test_sse_response_runs_on_close_once_even_if_never_started() -> None:
    closed: list[str] = []

    async def events() -> Any:
        yield b"data: 1\n\n"
        await asyncio.Event().wait()

    async def on_close() -> None:
        closed.append("x")

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}  # gone before the first byte

        async def send(message: dict[str, Any]) -> None:
            pass

        await SSEResponse(events(), on_close)({"type": "http"}, receive, send)

    asyncio.run(main())
    assert closed == ["x"]


def test_sse_response_treats_a_broken_socket_as_a_disconnect() -> None:
    closed: list[str] = []

    async def events() -> Any:
        while True:
            yield b"data: 1\n\n"

    async def on_close() -> None:
        closed.append("x")

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the server never reports the disconnect...
            return {}

        async def send(message: dict[str, Any]) -> None:
            if message.get("body"):
                raise OSError("connection reset")  # ...its send fails instead

        await SSEResponse(events(), on_close)({"type": "http"}, receive, send)

    asyncio.run(main())
    assert closed == ["x"]
