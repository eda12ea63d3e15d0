"""Streams as benchmark clients read them: the role chunk with the first token, continuous usage stats."""

from __future__ import annotations

from typing import Any

from gateway.engine_client import RequestFailedError
from gateway.generation import Usage
from gateway.openai_format import ResponseFormat
from tests.gateway.fakes import Script
from tests.gateway.test_app import CHAT, sse_events

STREAM = {**CHAT, "stream": True}


def test_role_chunk_waits_for_the_first_token(make_gateway: Any) -> None:
    """The engine fails before any token: no role chunk went out at admission, only the error event."""
    gw = make_gateway(lambda req: Script([[]], fail=RequestFailedError("boom")))
    events = sse_events(gw.post("/v1/chat/completions", STREAM).text)
    assert len(events) == 1 and events[0]["error"]["code"] == "request_rejected"


def test_role_chunk_goes_out_with_the_first_token_even_if_its_text_is_held_back(make_gateway: Any) -> None:
    # ' Paris' ' is': the stop string " is lov" holds " is" back; the role chunk still precedes it.
    gw = make_gateway(lambda req: Script([[314, 7042]]))  # " is", " Paris"
    events = sse_events(gw.post("/v1/chat/completions", {**STREAM, "stop": [" is lov"]}).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert text == " is Paris"


def test_every_token_goes_out_as_a_chunk_even_when_its_text_is_held_back(make_gateway: Any) -> None:
    """' is' waits for ' Paris' (the stop string " is lov" might follow): its token still goes out, as an
    empty delta, so that clients timing tokens by chunks see it when it was made, not one step later."""
    gw = make_gateway(lambda req: Script([[314, 7042]]))  # " is", " Paris"
    for path, body, text_of in (
        ("/v1/chat/completions", {**STREAM, "stop": [" is lov"]}, lambda c: c["delta"].get("content")),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "stream": True, "stop": [" is lov"]},
         lambda c: c["text"]),
    ):
        events = sse_events(gw.post(path, body).text)
        choices = [e["choices"][0] for e in events[:-1] if e.get("choices")]
        tokens = [text_of(c) for c in choices if c["finish_reason"] is None and "role" not in c.get("delta", {})]
        assert tokens == ["", " is Paris"], path


def test_a_choice_that_finishes_without_text_still_gets_role_and_finish(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[]], reason="stop"))
    events = sse_events(gw.post("/v1/chat/completions", STREAM).text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_continuous_usage_stats_put_usage_in_every_chunk(make_gateway: Any) -> None:
    gw = make_gateway()
    body = {**STREAM, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = sse_events(gw.post("/v1/chat/completions", body).text)
    chunks = events[:-1]
    assert all(c["usage"] is not None for c in chunks)
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 4
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in chunks)
    assert chunks[-1]["choices"] == []  # the final usage chunk as with include_usage alone


def test_continuous_usage_stats_without_include_usage_changes_nothing(make_gateway: Any) -> None:
    gw = make_gateway()
    for options in ({"continuous_usage_stats": True}, {"include_usage": True, "continuous_usage_stats": False}):
        events = sse_events(gw.post("/v1/completions", {"model": "smollm2", "prompt": "x", "stream": True,
                                                        "stream_options": options}).text)
        usage_in_chunks = [e.get("usage") for e in events[:-2]]
        assert all(u is None for u in usage_in_chunks)


def test_response_format_keeps_usage_null_without_continuous_stats() -> None:
    fmt = ResponseFormat("chat", "chatcmpl-1", "m", include_usage=True)
    assert fmt.text_chunk(0, "x", Usage(3, 1))["usage"] is None
    fmt = ResponseFormat("chat", "chatcmpl-1", "m", include_usage=True, continuous_usage=True)
    assert fmt.text_chunk(0, "x", Usage(3, 1))["usage"]["total_tokens"] == 4


def test_vllm_bench_serve_payloads_are_accepted(make_gateway: Any) -> None:
    """The bodies `vllm bench serve` sends (its openai and openai-chat backends, with --ignore-eos)."""
    gw = make_gateway()
    completions = {"model": "smollm2", "prompt": "Hello there", "repetition_penalty": 1.0, "max_tokens": 4,
                   "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    events = sse_events(gw.post("/v1/completions", completions).text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 4
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
            "max_completion_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}
    events = sse_events(gw.post("/v1/chat/completions", chat).text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 4
    # The first chunk with choices (where that client stamps TTFT) is the role chunk of the first token.
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
