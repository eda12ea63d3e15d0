"""End to end over real processes: redis-server, the engine with SmolLM2, the gateway, plain HTTP.

Token counts are kept small: the whole module must fit the default suite's
budget on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "England": "London", "Germany": "Berlin",
            "Russia": "Moscow", "China": "Beijing", "Egypt": "Cairo", "Greece": "Athens"}


def chat_body(question: str, **kw: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": question}], "temperature": 0, **kw}


def parse_sse(raw: str) -> list[Any]:
    """Strict: the body is a sequence of `data: <payload>\\n\\n` events and nothing else."""
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for block in raw[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block
        payload = block[6:]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def collect_chat(events: list[Any]) -> tuple[str, str | None, dict[str, Any] | None]:
    """(text, finish_reason, usage) of a one-choice chat stream, checking the chunk format on the way."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "smollm2" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]["usage"] if chunks[-1]["choices"] == [] else None
    choice_chunks = chunks[:-1] if usage is not None else chunks
    finish = choice_chunks[-1]["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in choice_chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in choice_chunks)
    return text, finish, usage


def test_streamed_chat_answers_paris_with_usage(stack: Stack) -> None:
    body = chat_body("What is the capital of France?", max_tokens=24, stream=True,
                     stream_options={"include_usage": True})
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=stack.headers(), timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    text, finish, usage = collect_chat(parse_sse(r.text))
    assert "Paris" in text and "\ufffd" not in text
    assert finish in ("stop", "length") and usage is not None
    # The same greedy request without streaming: same text, same usage.
    whole = httpx.post(f"{stack.base_url}/v1/chat/completions", json=chat_body("What is the capital of France?",
                       max_tokens=24), headers=stack.headers(), timeout=60).json()
    assert whole["choices"][0]["message"]["content"] == text
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert whole["usage"][field] == usage[field]
    # The second request found the first one's prompt blocks in the prefix cache (full blocks only).
    assert 0 < whole["usage"]["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 20  # chat template + question


def test_usage_counts_exact_tokens(stack: Stack) -> None:
    prompt = [1, 504, 3575, 282, 4649, 314]  # BOS "The capital of France is"
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 5, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{stack.base_url}/v1/completions", json=body, headers=stack.headers(), timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == 6 and out["usage"]["completion_tokens"] == 5
    assert out["usage"]["total_tokens"] == 11


def test_stop_string_and_n_samples(stack: Stack) -> None:
    body = chat_body("What is the capital of France?", max_tokens=16, stop=[" Paris"])
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=stack.headers(), timeout=60).json()
    assert r["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "The capital of France is"},
                               "logprobs": None, "finish_reason": "stop"}
    assert r["usage"]["completion_tokens"] == 6  # up to the token that completed " Paris"

    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True, "n": 2,
            "temperature": 1.0, "seed": 7, "stream": True, "stream_options": {"include_usage": True}}
    r2 = httpx.post(f"{stack.base_url}/v1/completions", json=body, headers=stack.headers(), timeout=60)
    events = parse_sse(r2.text)
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in events[:-2]
                if c["choices"][0]["finish_reason"]}
    assert finishes == {0: "length", 1: "length"}
    assert events[-2]["usage"]["completion_tokens"] == 8 and events[-1] == "[DONE]"


@pytest.mark.parametrize("which", ["none", "wrong", "revoked"])
def test_bad_keys_get_401(stack: Stack, which: str) -> None:
    headers = {"none": {}, "wrong": stack.headers("ps-" + "x" * 43), "revoked": stack.headers(stack.revoked_key)}
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=chat_body("hi"), headers=headers[which], timeout=30)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("patch", "param"),
    [({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"max_tokens": "ten"}, "max_tokens"),
     ({"n": 100}, "n"), ({"stop": [1]}, "stop"), ({"messages": [{"role": "user", "content": None}]},
     "messages[0].content"), ({"use_beam_search": True, "temperature": 0.7}, "temperature")],
)
def test_bad_fields_get_400_naming_them(stack: Stack, patch: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json={**chat_body("hi"), **patch},
                   headers=stack.headers(), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_prompt_too_long_gets_400_with_limits(stack: Stack) -> None:
    info = httpx.get(f"{stack.base_url}/v1/models", headers=stack.headers(), timeout=30).json()["data"][0]
    limit = info["max_model_len"]
    body = {"model": "smollm2", "prompt": [504] * (limit + 10), "max_tokens": 4}
    r = httpx.post(f"{stack.base_url}/v1/completions", json=body, headers=stack.headers(), timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and str(limit) in err["message"]


def test_disconnect_mid_stream_aborts_and_frees_blocks(stack: Stack) -> None:
    before = stack.stats()
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=body, headers=stack.headers(),
                      timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 3:
                break
    cut = time.monotonic()  # leaving the block closed the connection mid-stream
    while True:
        s = stack.stats()
        if (s.num_aborted > before.num_aborted and s.num_running == 0 and s.num_waiting == 0
                and s.num_free_blocks == s.num_total_blocks):
            break
        assert time.monotonic() - cut < 1.0, f"engine still busy 1 s after the disconnect: {s}"
        time.sleep(0.02)


def test_32_concurrent_streams_are_batched_and_not_interleaved(stack: Stack) -> None:
    countries = list(CAPITALS) * 4
    results, max_running = asyncio.run(_concurrent_streams(stack, countries))
    assert len(results) == 32
    ids = set()
    for country, (chunk_id, text, finish) in zip(countries, results, strict=True):
        ids.add(chunk_id)
        assert CAPITALS[country] in text and country in text, (country, text)
        others = [w for c, cap in CAPITALS.items() if c != country for w in (c, cap)]
        assert not any(w in text for w in others), (country, text)
        assert finish in ("stop", "length")
    assert len(ids) == 32
    assert max_running > 1  # seen while the streams ran
    assert stack.stats().max_requests_per_step > 1


async def _concurrent_streams(stack: Stack, countries: list[str]) -> tuple[list[tuple[str, str, str]], int]:
    from gateway.engine_client import EngineClient

    engine = EngineClient(stack.engine_address)
    await engine.start()
    max_running = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal max_running
        while not done.is_set():
            with contextlib.suppress(TimeoutError):  # stats are answered between steps; a step may be long
                max_running = max(max_running, (await engine.stats(timeout=60)).num_running)
            await asyncio.sleep(0.05)

    async def one(client: httpx.AsyncClient, country: str) -> tuple[str, str, str]:
        # "The capital of X is Y.<|im_end|>" is 8 tokens: enough for the answer, no more.
        body = chat_body(f"What is the capital of {country}?", max_tokens=8, stream=True)
        r = await client.post("/v1/chat/completions", json=body, headers=stack.headers())
        assert r.status_code == 200, r.text
        events = parse_sse(r.text)
        text, finish, _ = collect_chat(events)
        assert finish is not None
        return events[0]["id"], text, finish

    limits = httpx.Limits(max_connections=64)
    try:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=600, limits=limits) as client:
            watcher = asyncio.create_task(watch())
            results = await asyncio.gather(*(one(client, c) for c in countries))
            done.set()
            await watcher
    finally:
        await engine.close()
    return list(results), max_running
