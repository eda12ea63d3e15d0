"""vLLM's output options through the gateway, with the fake engine: each one changes what it should.

The fake engine says " Paris is lovely." (tests/gateway/conftest.py) and, when asked, sends made-up
prompt logprobs: prompt token i gets -i/100 (tests/gateway/fakes.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.output_options import bad_words_token_ids
from gateway.tokenizer import ChatTemplateError, TextTokenizer
from tests.gateway.fakes import Script

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 4}
COMPLETION = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4}
SAID = " Paris is lovely."
SAID_IDS = [7042, 314, 17915, 30]


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(b[6:]) for b in text.strip().split("\n\n") if b != "data: [DONE]"]


def test_include_stop_str_in_output_keeps_the_stop_string(make_gateway: Any) -> None:
    gw = make_gateway()
    cut = gw.post("/v1/completions", {**COMPLETION, "stop": " is"}).json()["choices"][0]["text"]
    kept = gw.post("/v1/completions", {**COMPLETION, "stop": " is", "include_stop_str_in_output": True})
    assert cut == " Paris" and kept.json()["choices"][0]["text"] == " Paris is"


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text(make_gateway: Any) -> None:
    gw = make_gateway(lambda r: Script(samples=[[7042, 2]]))  # 2: <|im_end|>
    skipped = gw.post("/v1/completions", COMPLETION).json()["choices"][0]["text"]
    kept = gw.post("/v1/completions", {**COMPLETION, "skip_special_tokens": False}).json()["choices"][0]["text"]
    assert skipped == " Paris" and kept == " Paris<|im_end|>"


def test_allowed_token_ids_and_bad_words_reach_the_engine(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "allowed_token_ids": [5, 7], "bad_words": ["Paris", " lovely day"]})
    assert r.status_code == 200, r.text
    sampling = gw.engine.submitted[0].sampling
    assert sampling.allowed_token_ids == (5, 7)
    assert sampling.bad_words_token_ids == bad_words_token_ids(["Paris", " lovely day"], tokenizer)
    assert tuple(tokenizer.encode(" Paris", add_special_tokens=False)) in sampling.bad_words_token_ids
    assert gw.post("/v1/chat/completions", {**CHAT, "allowed_token_ids": []}).json()["error"]["param"] == (
        "allowed_token_ids")
    too_big = gw.post("/v1/chat/completions", {**CHAT, "allowed_token_ids": [10**6]})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "allowed_token_ids"


def test_truncate_prompt_tokens_keeps_the_last_tokens(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, "prompt": list(range(10, 30)), "truncate_prompt_tokens": 5})
    assert r.status_code == 200 and gw.engine.submitted[0].prompt_token_ids == [25, 26, 27, 28, 29]
    assert r.json()["usage"]["prompt_tokens"] == 5


def test_chat_template_options_change_the_prompt(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    text = []
    for extra in ({}, {"add_generation_prompt": False},
                  {"continue_final_message": True, "add_generation_prompt": False,
                   "messages": [*CHAT["messages"], {"role": "assistant", "content": "It is"}]}):
        assert gw.post("/v1/chat/completions", {**CHAT, **extra}).status_code == 200
        text.append(tokenizer.decode(gw.engine.submitted[-1].prompt_token_ids, skip_special_tokens=False))
    assert text[0].endswith("<|im_start|>assistant\n") and text[1].endswith("?<|im_end|>\n")
    assert text[2].endswith("<|im_start|>assistant\nIt is")
    for bad in ({"continue_final_message": True},  # the last message is the user's
                {"continue_final_message": True, "add_generation_prompt": True,
                 "messages": [*CHAT["messages"], {"role": "assistant", "content": "It is"}]}):
        r = gw.post("/v1/chat/completions", {**CHAT, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_chat_template_kwargs_are_template_variables() -> None:
    from tokenizers import Tokenizer, models

    template = "{% if shout %}LOUD {% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    tok = TextTokenizer(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")), {}, template)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == "hi"
    assert tok.apply_chat_template(messages, template_kwargs={"shout": True}) == "LOUD hi"
    assert tok.apply_chat_template(messages, template_kwargs={"messages": [], "shout": False}) == "hi"
    calls = TextTokenizer(tok._tok, {}, "{{ raise_exception('no') if shout }}{{ shout.upper() }}")
    with pytest.raises(ChatTemplateError):  # whatever the client's variables do: a 400, never a 500
        calls.apply_chat_template(messages, template_kwargs={"raise_exception": "x", "shout": 5})


def test_return_token_ids_whole_and_streamed(make_gateway: Any) -> None:
    gw = make_gateway()
    body = gw.post("/v1/chat/completions", {**CHAT, "return_token_ids": True}).json()
    assert body["prompt_token_ids"] == gw.engine.submitted[0].prompt_token_ids
    assert body["choices"][0]["token_ids"] == SAID_IDS
    r = gw.post("/v1/completions", {**COMPLETION, "return_token_ids": True, "stream": True})
    chunks = [c for c in events(r.text) if c["choices"]]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == gw.engine.submitted[1].prompt_token_ids
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == SAID_IDS
    plain = gw.post("/v1/chat/completions", CHAT).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_echo_puts_the_prompt_first(make_gateway: Any) -> None:
    gw = make_gateway()
    choice = gw.post("/v1/completions", {**COMPLETION, "echo": True}).json()["choices"][0]
    assert choice["text"] == COMPLETION["prompt"] + SAID
    r = gw.post("/v1/completions", {**COMPLETION, "echo": True, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in events(r.text) if c["choices"]) == COMPLETION["prompt"] + SAID
    assert gw.post("/v1/chat/completions", {**CHAT, "echo": True}).json()["error"]["param"] == "echo"


def test_echo_with_logprobs_and_max_tokens_0_gives_the_prompts_logprobs(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    prompt_ids = gw.engine.submitted[0].prompt_token_ids
    assert gw.engine.submitted[0].sampling.prompt_logprobs == 1
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == COMPLETION["prompt"]
    assert lp["tokens"] == [tokenizer.decode([t]) for t in prompt_ids]
    assert lp["token_logprobs"] == [None] + [-i / 100 for i in range(1, len(prompt_ids))]
    assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 1
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert body["choices"][0]["finish_reason"] == "length"
    with_output = gw.post("/v1/completions", {**COMPLETION, "echo": True, "logprobs": 0}).json()["choices"][0]
    assert with_output["text"] == COMPLETION["prompt"] + SAID
    assert len(with_output["logprobs"]["tokens"]) == len(prompt_ids) + len(SAID_IDS)
    assert with_output["logprobs"]["text_offset"][len(prompt_ids)] == len(COMPLETION["prompt"])


def test_max_tokens_0_needs_echo(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**COMPLETION, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_logprobs_on_chat_in_vllms_shape(make_gateway: Any, stream: bool) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "prompt_logprobs": 2, "stream": stream})
    body = r.json() if not stream else next(c for c in events(r.text) if "prompt_logprobs" in c)
    prompt_ids = gw.engine.submitted[0].prompt_token_ids
    plp = body["prompt_logprobs"]
    assert len(plp) == len(prompt_ids) and plp[0] is None
    second = plp[1][str(prompt_ids[1])]
    assert second["logprob"] == -0.01 and second["rank"] == 1 and len(plp[1]) == 2
