"""The HTTP load generator against a tiny fake OpenAI server (real uvicorn on loopback, real SSE).

The fake streams like vLLM: for chat a role-only chunk first, then, after a
prefill delay, one content chunk per token 10 ms apart, an empty-text chunk in
the middle (a token the detokenizer holds back), a finish-only chunk, the usage
chunk and [DONE].
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ops.bench.load import Arrival, run_load
from ops.bench.openai_client import Target, send_openai
from ops.bench.serve_stats import RequestTiming
from ops.bench.workloads import WorkloadRequest

PREFILL_S = 0.15
GAP_S = 0.01
KEY = "sk-good"


def _chunk(body: dict, text: str, role: bool = False, finish: str | None = None) -> str:
    if "messages" in body:
        delta = {"role": "assistant", "content": ""} if role else {} if finish else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    return "data: " + json.dumps({"choices": [choice]}) + "\n\n"


async def _generate(body: dict) -> AsyncIterator[str]:
    n = body["max_tokens"]
    produced = n - 2 if body.get("short") else n  # "short": the server stops early
    if "messages" in body:
        yield _chunk(body, "", role=True)  # sent at once: must not count as the first token
    await asyncio.sleep(PREFILL_S)
    for i in range(produced):
        yield _chunk(body, "" if i == 2 else f" t{i}")
        await asyncio.sleep(GAP_S)
    yield _chunk(body, "", finish="length")  # no token: must not end a gap
    await asyncio.sleep(GAP_S)
    usage = {"prompt_tokens": 7, "completion_tokens": produced, "total_tokens": 7 + produced}
    yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
    yield "data: [DONE]\n\n"


async def completions(request: Request) -> Response:
    if request.headers.get("authorization") != f"Bearer {KEY}":
        return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error", "param": None,
                                       "code": "invalid_api_key"}}, status_code=401)
    body = await request.json()
    assert body["stream"] is True and body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True}  # never continuous_usage_stats
    return StreamingResponse(_generate(body), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", completions, methods=["POST"])])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def send_all(target: Target, reqs: list[WorkloadRequest]) -> list[RequestTiming]:
    async def go() -> list[RequestTiming]:
        async with httpx.AsyncClient(timeout=10) as client:
            async def send(i: int, r: WorkloadRequest, t0: float) -> RequestTiming:
                return await send_openai(client, target, i, r, t0)

            timings, _ = await run_load(send, [Arrival(i, r, 0.0) for i, r in enumerate(reqs)])
            return timings

    return asyncio.run(go())


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_ttft_at_the_first_token_and_itl_between_token_chunks(fake_server: str, endpoint: str) -> None:
    target = Target("fake", fake_server, "m", {"default": KEY}, endpoint, detokenize=lambda ids: "x" * len(ids))
    [t] = send_all(target, [WorkloadRequest((20, 21, 22), 8)])
    assert t.ok, t.error
    assert t.output_tokens == 8 and t.prompt_tokens == 7  # from the usage chunk
    assert PREFILL_S <= t.ttft < PREFILL_S + 0.15  # the role chunk came at once and is no token
    assert len(t.itl) == 7  # 8 tokens, 8 chunks: the one whose text is held back counts, the finish does not
    assert len(t.text_itl) == 6  # what a reader sees: 7 chunks with text
    assert t.e2e >= t.ttft + 7 * GAP_S * 0.9


def test_errors_are_reported_by_kind(fake_server: str) -> None:
    bad = Target("fake", fake_server, "m", {"default": "sk-wrong"})
    good = Target("fake", fake_server, "m", {"default": KEY})
    [refused] = send_all(bad, [WorkloadRequest((20,), 4)])
    assert refused.error == "http 401 invalid_api_key" and not refused.ok
    nothing = Target("fake", "http://127.0.0.1:9", "m", {})
    [down] = send_all(nothing, [WorkloadRequest((20,), 4)])
    assert down.error == "ConnectError"
    [ok] = send_all(good, [WorkloadRequest((20,), 4)])
    assert ok.ok


def test_fewer_tokens_than_asked_is_incomplete(fake_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.bench import openai_client

    original = openai_client.request_body
    monkeypatch.setattr(openai_client, "request_body",
                        lambda target, req: (lambda p, b: (p, {**b, "short": True}))(*original(target, req)))
    [t] = send_all(Target("fake", fake_server, "m", {"default": KEY}), [WorkloadRequest((20,), 6)])
    assert t.error == "incomplete: 4/6 tokens"


def test_each_tenant_sends_its_own_key() -> None:
    t = Target("x", "http://h", "m", {"default": "k0", "light": "k1"})
    assert t.headers("light") == {"Authorization": "Bearer k1"}
    assert t.headers("heavy") == {"Authorization": "Bearer k0"}
    assert Target("x", "http://h", "m").headers("a") == {}
