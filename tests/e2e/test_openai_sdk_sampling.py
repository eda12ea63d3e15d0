"""The official `openai` Python SDK, unchanged, against the real stack: logprobs, penalties, logit_bias.

Each feature streamed and not streamed, greedy where the test asserts tokens
(the default model, real engine process, real gateway). Values our API adds to
OpenAI's (repetition_penalty, min_p) go through the SDK's `extra_body`, as with vLLM.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import openai
import pytest

from gateway.tokenizer import TextTokenizer
from shared.model_store import resolve_model
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LOOPY = "List the days of the week, again and again: Monday, Tuesday, Wednesday, Monday, Tuesday, Wednesday,"


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=stack.key, max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_folder(resolve_model("smollm2").path)


def chat(client: openai.OpenAI, stream: bool, **kw: Any) -> tuple[str, list[Any]]:
    """(text, logprobs content entries) of one greedy chat choice, streamed or whole."""
    kw = {"model": "smollm2", "messages": QUESTION, "temperature": 0, "max_tokens": 8, **kw}
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        return choice.message.content or "", (choice.logprobs.content or []) if choice.logprobs else []
    text, entries = "", []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                entries += chunk.choices[0].logprobs.content or []
    return text, entries


def completion_tokens(client: openai.OpenAI, stream: bool, **kw: Any) -> list[str]:
    kw = {"model": "smollm2", "prompt": LOOPY, "temperature": 0, "max_tokens": 16, "logprobs": 0,
          "extra_body": {"ignore_eos": True, **kw.pop("extra_body", {})}, **kw}
    if not stream:
        return list(client.completions.create(**kw).choices[0].logprobs.tokens)
    return [t for c in client.completions.create(stream=True, **kw) if c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_with_top_logprobs(client: openai.OpenAI, stream: bool) -> None:
    text, entries = chat(client, stream, logprobs=True, top_logprobs=3)
    tokens = "".join(e.token for e in entries)
    # The EOS token that ended the choice has logprobs too (as in vLLM), though it adds no text.
    assert len(entries) <= 8 and tokens.removesuffix("<|im_end|>") == text and "Paris" in text
    for e in entries:
        assert e.bytes == list(e.token.encode()) and e.logprob <= 0.0
        assert len(e.top_logprobs) == 3
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert e.token == e.top_logprobs[0].token and e.logprob == e.top_logprobs[0].logprob  # greedy: the best


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs(client: openai.OpenAI, stream: bool) -> None:
    kw = {"model": "smollm2", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 6, "logprobs": 2}
    if stream:
        parts = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
        text = "".join(p.text for p in parts)
        tokens = [t for p in parts if p.logprobs for t in p.logprobs.tokens]
        tops = [t for p in parts if p.logprobs for t in p.logprobs.top_logprobs]
    else:
        choice = client.completions.create(**kw).choices[0]
        text, tokens, tops = choice.text, choice.logprobs.tokens, choice.logprobs.top_logprobs
        assert choice.logprobs.text_offset == [sum(map(len, tokens[:i])) for i in range(len(tokens))]
    assert "".join(tokens) == text and len(tokens) == 6 and all(len(t) == 2 for t in tops)


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_forces_a_token(client: openai.OpenAI, tokenizer: TextTokenizer, stream: bool) -> None:
    (forced,) = tokenizer.encode(" banana", add_special_tokens=False)
    text, _ = chat(client, stream, max_tokens=3, logit_bias={str(forced): 100})
    assert text == " banana" * 3
    sampled, _ = chat(client, stream, max_tokens=3, temperature=1.0, seed=3, logit_bias={str(forced): 100})
    assert sampled == " banana" * 3


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "penalty",
    [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.8}}],
    ids=["frequency", "presence", "repetition"],
)
def test_each_penalty_breaks_a_greedy_loop(client: openai.OpenAI, stream: bool, penalty: dict[str, Any]) -> None:
    plain = completion_tokens(client, stream)
    penalised = completion_tokens(client, stream, **penalty)
    assert len(plain) == len(penalised) == 16
    most_repeated = Counter(plain).most_common(1)[0][1]
    assert Counter(penalised).most_common(1)[0][1] < most_repeated, (plain, penalised)


@pytest.mark.parametrize("stream", [False, True])
def test_min_p_is_accepted_and_near_greedy_at_a_high_floor(client: openai.OpenAI, stream: bool) -> None:
    greedy = completion_tokens(client, stream, max_tokens=8)
    floored = completion_tokens(client, stream, max_tokens=8, temperature=1.0, seed=1, extra_body={"min_p": 0.999})
    assert floored == greedy  # only the most likely token clears a floor of 0.999 x its probability


@pytest.mark.parametrize(
    ("kw", "param"),
    [({"logit_bias": {"49152": 5}}, "logit_bias"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")],
)
def test_bad_values_are_400_naming_param(client: openai.OpenAI, kw: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2, **kw)
    assert e.value.status_code == 400 and e.value.param == param
