"""The gateway's transformers-free tokenizer matches `AutoTokenizer` on the default model."""

from __future__ import annotations

import pytest

from gateway.tokenizer import ChatTemplateError, TextTokenizer
from shared.model_store import resolve_model

TEXTS = ["What is the capital of France?", "Hi 😀 你好世界 café", "  leading spaces\n\ttabs", "<|im_end|> literal",
         "Ελληνικά, русский, עברית, हिन्दी", ""]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Emoji? 😀"}],
]


@pytest.mark.slow
def test_matches_transformers(tokenizer: TextTokenizer) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(resolve_model("smollm2").path)
    assert len(tokenizer) == len(reference) and tokenizer.eos_token_id == reference.eos_token_id
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=True)
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True,
                                                         clean_up_tokenization_spaces=False)
    for chat in CHATS:
        for gen in (True, False):
            expected = reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert tokenizer.apply_chat_template(chat, add_generation_prompt=gen) == expected


def test_special_tokens_skipped_on_decode(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>assistant\nParis<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "assistant\nParis"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\nParis<|im_end|>"


def test_template_errors_are_typed() -> None:
    import tokenizers

    tok = TextTokenizer(tokenizers.Tokenizer(tokenizers.models.BPE()), {},
                        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="user first"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    assert TextTokenizer(tokenizers.Tokenizer(tokenizers.models.BPE()), {}, None).chat_template is None
