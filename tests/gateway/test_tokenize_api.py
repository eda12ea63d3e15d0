"""/tokenize, /detokenize (vLLM's shapes) and /v1/models/{model}."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.test_app import CHAT


def test_tokenize_a_prompt_and_back(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    r = gw.post("/tokenize", {"model": "smollm2", "prompt": "Hello world", "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == tokenizer.encode("Hello world")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    assert body["token_strs"] == [tokenizer.id_to_token(t) for t in body["tokens"]]
    r = gw.post("/detokenize", {"model": "smollm2", "tokens": body["tokens"]})
    assert r.json() == {"prompt": "Hello world"}


def test_tokenize_without_model_and_without_special_tokens(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    body = gw.post("/tokenize", {"prompt": "Hi", "add_special_tokens": False}).json()
    assert body["tokens"] == tokenizer.encode("Hi", add_special_tokens=False) and body["token_strs"] is None


def test_tokenize_chat_matches_what_generation_sends(make_gateway: Any) -> None:
    gw = make_gateway()
    tokens = gw.post("/tokenize", {"model": "smollm2", "messages": CHAT["messages"]}).json()["tokens"]
    gw.post("/v1/chat/completions", CHAT)
    assert tokens == gw.engine.submitted[0].prompt_token_ids
    without = gw.post("/tokenize", {"messages": CHAT["messages"], "add_generation_prompt": False}).json()["tokens"]
    assert len(without) < len(tokens) and tokens[:len(without)] == without


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{1}}"}, 400,
         "chat_template"),
        ("/detokenize", {"tokens": [1, 10**6]}, 400, "tokens"),
        ("/detokenize", {"tokens": [2**64]}, 400, "tokens[0]"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ],
)
def test_tokenizer_endpoints_refuse_bad_bodies(make_gateway: Any, path: str, body: dict[str, Any], status: int,
                                               param: str) -> None:
    gw = make_gateway()
    r = gw.post(path, body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_tokenizer_endpoints_need_a_key(make_gateway: Any) -> None:
    gw = make_gateway()
    assert gw.client.post("/tokenize", json={"prompt": "x"}).status_code == 401
    assert gw.post("/detokenize", {"tokens": [1]}, key=gw.revoked_key).status_code == 401


def test_model_by_id(make_gateway: Any) -> None:
    gw = make_gateway()
    auth = {"Authorization": f"Bearer {gw.key}"}
    r = gw.client.get("/v1/models/smollm2", headers=auth)
    assert r.status_code == 200 and r.json()["id"] == "smollm2" and r.json()["object"] == "model"
    assert r.json() == gw.client.get("/v1/models", headers=auth).json()["data"][0]
    r = gw.client.get("/v1/models/org/other", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert gw.client.get("/v1/models/smollm2").status_code == 401
