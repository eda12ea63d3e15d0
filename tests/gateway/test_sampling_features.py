"""The gateway's side of logprobs, penalties, logit_bias, min_p and the engine's sampling defaults.

The fake engine sends well-formed made-up logprobs (tests/gateway/fakes.py); the
shapes checked here are OpenAI's: chat `logprobs.content[]` with token, logprob,
bytes, top_logprobs; completions' tokens, token_logprobs, top_logprobs, text_offset.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from shared.protocol import SamplingDefault
from tests.gateway.fakes import MODEL_INFO

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 4}
COMPLETION = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4}
SAID = " Paris is lovely."  # what the fake engine's echo script says (tests/gateway/conftest.py)


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(b[6:]) for b in text.strip().split("\n\n") if b != "data: [DONE]"]


def test_chat_logprobs_have_openais_shape(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"] == SAID
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["bytes"] == list(e["token"].encode()) and e["logprob"] == -0.25
        assert [t["logprob"] for t in e["top_logprobs"]] == [-0.25, -1.25]
        assert all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"])
    assert gw.engine.submitted[0].sampling.logprobs == 2


def test_chat_logprobs_without_alternatives_and_rows_that_did_not_ask(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "logprobs": True})
    assert all(e["top_logprobs"] == [] for e in r.json()["choices"][0]["logprobs"]["content"])
    plain = gw.post("/v1/chat/completions", {**CHAT, "logprobs": False})
    assert plain.json()["choices"][0]["logprobs"] is None
    assert gw.engine.submitted[0].sampling.logprobs == 0 and gw.engine.submitted[1].sampling.logprobs is None


def test_streamed_chat_carries_each_tokens_logprobs(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "stream": True, "logprobs": True, "top_logprobs": 1})
    chunks = [c for c in events(r.text) if c["choices"] and c["choices"][0]["logprobs"] is not None]
    tokens = [e["token"] for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events(r.text))
    assert "".join(tokens) == text == SAID and len(tokens) == 4


def test_completion_logprobs_have_openais_shape(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, "logprobs": 3})
    lp = r.json()["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == SAID and lp["token_logprobs"] == [-0.25] * 4
    assert [len(t) for t in lp["top_logprobs"]] == [3] * 4 and all(isinstance(t, dict) for t in lp["top_logprobs"])
    offsets = [sum(len(t) for t in lp["tokens"][:i]) for i in range(4)]
    assert lp["text_offset"] == offsets


def test_streamed_completion_logprobs(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, "logprobs": 0, "stream": True})
    parts = [c["choices"][0]["logprobs"] for c in events(r.text) if c["choices"][0]["logprobs"]]
    assert "".join(t for p in parts for t in p["tokens"]) == SAID
    assert [o for p in parts for o in p["text_offset"]] == [0, 6, 9, 16]


@pytest.mark.parametrize(("body", "param"), [({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"),
                                             ({"logit_bias": {"-3": 1}}, "logit_bias")])
def test_bad_completion_values_are_400_naming_them(make_gateway: Any, body: dict[str, Any], param: str) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_penalties_bias_and_min_p_reach_the_engine(make_gateway: Any) -> None:
    gw = make_gateway()
    body = {**CHAT, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.1, "min_p": 0.05,
            "logit_bias": {"42": 100, "7": -100.0}}
    assert gw.post("/v1/chat/completions", body).status_code == 200
    s = gw.engine.submitted[0].sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p) == (0.5, -0.25, 1.1, 0.05)
    assert dict(s.logit_bias) == {42: 100.0, 7: -100.0}


def test_the_engines_defaults_fill_only_what_the_request_left_out(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.model_info = dataclasses.replace(MODEL_INFO, default_sampling=(
        SamplingDefault("temperature", 0.2), SamplingDefault("top_p", 0.9), SamplingDefault("top_k", 40.0)))
    gw.post("/v1/chat/completions", CHAT)
    gw.post("/v1/chat/completions", {**CHAT, "temperature": 1.0, "top_k": 0})
    gw.post("/v1/completions", {**COMPLETION, "top_p": 0.5})
    first, second, third = (r.sampling for r in gw.engine.submitted)
    assert (first.temperature, first.top_p, first.top_k) == (0.2, 0.9, 40)
    assert (second.temperature, second.top_p, second.top_k) == (1.0, 0.9, 0)  # the request's own values win
    assert (third.temperature, third.top_p, third.top_k) == (0.2, 0.5, 40)
