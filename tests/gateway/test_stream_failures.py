"""An exception in one stream's detokenising or stop-string handling fails that request only:
a 500 with an OpenAI body, or an SSE error event; the engine is told to stop it; the next request is served.
A request the engine aborted at its deadline is a 504."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.detokenizer import IncrementalDetokenizer
from gateway.engine_client import RequestFailedError
from shared.protocol import DEADLINE_EXCEEDED
from tests.gateway.fakes import Script

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _events(text: str) -> list[Any]:
    return [json.loads(b[6:]) if b[6:] != "[DONE]" else "[DONE]" for b in text.strip().split("\n\n")]


@pytest.fixture
def broken_detokenizer(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    state = {"broken": True}
    real = IncrementalDetokenizer.push

    def push(self: IncrementalDetokenizer, token_ids: list[int]) -> str:
        if state["broken"]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real(self, token_ids)

    monkeypatch.setattr(IncrementalDetokenizer, "push", push)
    return state


def test_a_stream_that_fails_ends_with_an_error_event(make_gateway: Any, broken_detokenizer: dict[str, bool]) -> None:
    gw = make_gateway()
    events = _events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert events[-1]["error"]["type"] == "internal_error" and "[DONE]" not in events
    broken_detokenizer["broken"] = False
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_a_whole_response_that_fails_is_a_500_body(make_gateway: Any, broken_detokenizer: dict[str, bool]) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 500 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    broken_detokenizer["broken"] = False
    assert gw.post("/v1/chat/completions", CHAT).status_code == 200


def test_a_request_the_engine_timed_out_is_504(make_gateway: Any) -> None:
    late = RequestFailedError("the request ran past the engine's deadline of 30 s", DEADLINE_EXCEEDED)
    gw = make_gateway(lambda req: Script([[7042]], fail=late))
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
    events = _events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert events[-1]["error"]["code"] == "request_timeout" and "[DONE]" not in events
