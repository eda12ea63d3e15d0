"""Incremental detokenization with the real SmolLM2 tokenizer: never a broken character."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hi 😀 你好世界 café",
    "🎉🎉 emoji 👩‍👩‍👧 family, flags 🇫🇷 and 日本語のテキスト",
    "plain ascii text with  double  spaces\nand newlines\n\n",
    "Ελληνικά, русский, עברית, हिन्दी",
]


def stream(tokenizer: Any, ids: list[int], prompt: list[int], step: int = 1) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    return [detok.push(ids[i:i + step]) for i in range(0, len(ids), step)]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_deltas_join_to_the_text_and_never_split_a_character(tokenizer: Any, text: str, step: int) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    deltas = stream(tokenizer, ids, prompt, step)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_a_split_character_waits_for_its_last_byte(tokenizer: Any) -> None:
    ids = tokenizer.encode(" 😀", add_special_tokens=False)
    assert len(ids) == 2  # byte-level BPE spreads the 4 bytes over two tokens
    assert tokenizer.decode(ids[:1]).endswith("\ufffd")  # what a naive per-token decode would send
    assert stream(tokenizer, ids, []) == ["", " 😀"]
    ids = tokenizer.encode("你好世界", add_special_tokens=False)
    assert stream(tokenizer, ids, []) == ["", "你", "", "好", "", "世", "", "", "界"]


def test_special_tokens_are_not_emitted(tokenizer: Any) -> None:
    ids = tokenizer.encode("Paris.", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert "".join(stream(tokenizer, ids, [1])) == "Paris."


def test_prompt_context_keeps_the_leading_space(tokenizer: Any) -> None:
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    ids = tokenizer.encode(" Paris", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids, prompt)) == " Paris"
