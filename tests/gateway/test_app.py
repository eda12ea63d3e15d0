"""HTTP shape of the gateway around a scripted fake engine: formats, errors, auth, aborts."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from gateway.engine_client import RequestFailedError
from tests.gateway.fakes import Script

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def sse_events(text: str) -> list[Any]:
    """Parse an SSE body strictly: every event is `data: ...` followed by a blank line."""
    assert text.endswith("\n\n")
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_chat_non_streaming_has_text_and_usage(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": " Paris is lovely."},
                                "logprobs": None, "finish_reason": "length"}]
    sent = gw.engine.submitted[0]
    assert body["usage"] == {"prompt_tokens": len(sent.prompt_token_ids), "completion_tokens": 4,
                             "total_tokens": len(sent.prompt_token_ids) + 4,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    # The chat template was applied: the prompt ends with the assistant turn header.
    assert sent.sampling.max_tokens == 8


def test_chat_stream_format(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("chatcmpl-")
    assert {c["created"] for c in chunks} == {chunks[0]["created"]}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "smollm2" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["usage"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == " Paris is lovely."
    last_choice = chunks[-2]["choices"][0]
    assert last_choice["finish_reason"] == "length" and last_choice["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_stream_without_usage_option_has_no_usage_field(make_gateway: Any) -> None:
    gw = make_gateway()
    events = sse_events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert all("usage" not in e for e in events[:-1])


def test_stop_string_cuts_text_and_aborts_engine(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[7042, 314, 17915, 30]], hang=True))
    r = gw.post("/v1/chat/completions", {**CHAT, "stop": [" is lov"]})
    body = r.json()
    assert body["choices"][0]["message"]["content"] == " Paris"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert gw.engine.aborted == [gw.engine.submitted[0].request_id]
    assert body["usage"]["completion_tokens"] == 3  # up to the token that completed the stop string


def test_stop_strings_wait_for_min_tokens(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[7042, 314, 7042, 314]], hang=True))  # " Paris is Paris is"
    r = gw.post("/v1/chat/completions", {**CHAT, "stop": " is", "min_tokens": 3, "max_tokens": 8})
    assert r.json()["choices"][0]["message"]["content"] == " Paris is Paris"


def test_n_samples_stream_as_separate_choices(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[7042, 30], [314, 17915, 30]], reason="stop"))
    events = sse_events(gw.post("/v1/chat/completions", {**CHAT, "n": 2, "stream": True}).text)
    texts: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str] = {}
    for c in events[:-1]:
        for ch in c["choices"]:
            texts[ch["index"]] += ch["delta"].get("content", "")
            if ch["finish_reason"]:
                finish[ch["index"]] = ch["finish_reason"]
    assert texts == {0: " Paris.", 1: " is lovely."} and finish == {0: "stop", 1: "stop"}


def test_completions_endpoint_text_and_token_prompt(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {"model": "smollm2", "prompt": "The capital of France is"})
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == " Paris is lovely."
    assert gw.engine.submitted[0].sampling.max_tokens == 16  # OpenAI's completions default
    r = gw.post("/v1/completions", {"model": "smollm2", "prompt": [504, 3575], "stream": True})
    events = sse_events(r.text)
    assert events[0]["object"] == "text_completion" and events[0]["choices"][0]["text"] == " Paris"
    assert gw.engine.submitted[1].prompt_token_ids == [504, 3575]


def test_default_max_tokens_fits_context_and_kv_pool(make_gateway: Any) -> None:
    gw = make_gateway()  # fake engine: context 256 tokens, KV pool 64 blocks x 16 = 1024 tokens
    gw.post("/v1/chat/completions", CHAT)
    sent = gw.engine.submitted[0]
    assert sent.sampling.max_tokens == 256 - len(sent.prompt_token_ids)
    gw.engine.model_info = dataclasses.replace(gw.engine.model_info, num_blocks=4)  # a pool of 64 tokens
    gw.post("/v1/chat/completions", CHAT)
    assert gw.engine.submitted[1].sampling.max_tokens == 64 - len(sent.prompt_token_ids)


def test_one_log_line_per_request_without_secrets(make_gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    gw = make_gateway()
    with caplog.at_level(logging.INFO, logger="pageserve.gateway"):
        body = gw.post("/v1/chat/completions", CHAT).json()
    lines = [r.getMessage() for r in caplog.records if body["id"] in r.getMessage()]
    assert len(lines) == 1 and " length prompt=" in lines[0] and "completion=4" in lines[0]
    assert all(gw.key not in r.getMessage() and "Paris" not in r.getMessage() for r in caplog.records)


def test_caller_context_reaches_the_engine(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.post("/v1/chat/completions", CHAT)
    sent = gw.engine.submitted[0]
    assert sent.tenant_id.startswith("t_") and sent.cache_salt and sent.weight > 0


@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer ps-not-a-real-key-000000000000000"])
def test_missing_or_unknown_key_is_401(make_gateway: Any, header: str | None) -> None:
    gw = make_gateway()
    headers = {} if header is None else {"Authorization": header}
    r = gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert gw.engine.submitted == []


def test_revoked_key_is_401(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", CHAT, key=gw.revoked_key)
    assert r.status_code == 401 and gw.engine.submitted == []
    assert gw.revoked_key not in r.text


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -5}, "max_completion_tokens"),
        ({"stop": ["ok", 5]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"logit_bias": {"49152": 2}}, "logit_bias"),  # one past the vocabulary
        ({"logit_bias": {"x": 2}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
        ({"model": 3}, "model"),
    ],
)
def test_bad_field_is_400_naming_it(make_gateway: Any, patch: dict[str, Any], param: str) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, **patch})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert gw.engine.submitted == []


def test_informational_fields_are_accepted(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "user": "u-1", "frequency_penalty": 0, "tools": None})
    assert r.status_code == 200


def test_malformed_json_is_400(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.client.post("/v1/chat/completions", content=b"{nope", headers={"Authorization": f"Bearer {gw.key}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_oversized_body_is_413(make_gateway: Any) -> None:
    gw = make_gateway()
    huge = {**CHAT, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    r = gw.post("/v1/chat/completions", huge)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Any:  # no Content-Length: caught while streaming in
        yield b'{"model": "smollm2", "messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"x" * 65536
        yield b'"}]}'

    r = gw.client.post("/v1/chat/completions", content=chunks(), headers={"Authorization": f"Bearer {gw.key}"})
    assert r.status_code == 413
    assert gw.engine.submitted == []


def test_unknown_model_is_404(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "model": "gpt-9"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_prompt_too_long_is_400_with_limits(make_gateway: Any) -> None:
    gw = make_gateway()  # fake engine: max_model_len 256
    r = gw.post("/v1/completions", {"model": "smollm2", "prompt": "word " * 300})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    assert "256" in err["message"]
    r = gw.post("/v1/completions", {"model": "smollm2", "prompt": "hello", "max_tokens": 300})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens" and "256" in err["message"]


def test_token_id_outside_vocab_is_400(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {"model": "smollm2", "prompt": [1, 10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_engine_dead_is_503(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.dead = True
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 503 and r.json()["error"]["type"] == "engine_unavailable"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.headers["retry-after"] == "2"  # an engine being restarted (pageserve up, systemd) is back in seconds
    assert gw.client.get("/health").status_code == 503


def test_engine_error_mid_stream_is_an_error_event(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[7042, 314]], fail=RequestFailedError("boom")))
    events = sse_events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert events[-1]["error"]["type"] == "internal_error" and "[DONE]" not in events
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == " Paris is"
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_request_error"


def test_engine_shutdown_abort_is_503(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[7042]], reason="abort"))  # SIGTERM'd engine aborts in-flight work
    events = sse_events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert events[-1]["error"]["type"] == "engine_unavailable" and "[DONE]" not in events
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]


def test_engine_refusal_before_output_is_400(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[]], fail=RequestFailedError("the request may need 9 KV blocks")))
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"]
    events = sse_events(gw.post("/v1/chat/completions", {**CHAT, "stream": True}).text)
    assert events[-1]["error"]["code"] == "request_rejected"


def test_models_and_health(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.client.get("/v1/models", headers={"Authorization": f"Bearer {gw.key}"})
    assert r.json()["data"][0]["id"] == "smollm2"
    assert gw.client.get("/v1/models").status_code == 401
    h = gw.client.get("/health")
    assert h.status_code == 200 and h.json()["engine"]["healthy"] and h.json()["redis"]["healthy"]
    assert gw.client.get("/nope").json()["error"]["code"] == "not_found"


def test_the_lifespan_freezes_the_start_up_objects_before_serving(make_gateway: Any) -> None:
    """No full collection walks the tokenizer's, Starlette's and pydantic's objects mid-stream."""
    import gc

    gc.unfreeze()
    try:
        gw = make_gateway()
        assert gc.get_freeze_count() > 0
        assert gw.post("/v1/completions", {"model": "smollm2", "prompt": "Hi", "max_tokens": 2}).status_code == 200
    finally:
        gc.unfreeze()
