"""Incremental detokenization: token ids arrive one step at a time, text leaves whole.

Owns turning one sample's growing token list into text deltas. Byte-level BPE
splits a multi-byte character (an emoji, most CJK) across tokens; decoding a
token alone gives U+FFFD. The vLLM/TGI technique keeps two offsets into the
token list and only releases text once the window decodes without a trailing
replacement character:

    tokens:  ... p p p p p | o o o o | n n
                 ^prefix_offset      ^read_offset
    prefix_text = decode(tokens[prefix_offset:read_offset])   (already emitted)
    full_text   = decode(tokens[prefix_offset:])
    delta       = full_text[len(prefix_text):]  once it no longer ends in U+FFFD

Decoding a short window (not the whole text) keeps each step O(1), and starting
the window a few tokens back gives tokenizers that merge spaces the context they
need. The last few prompt tokens seed the window for the same reason.

This module knows nothing about stop strings, HTTP or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

PROMPT_CONTEXT_TOKENS = 6
"""How many trailing prompt tokens seed the window (vLLM uses 5 before read_offset)."""

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the detokenizer needs."""

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


class IncrementalDetokenizer:
    """One sample's text, released token by token without ever splitting a character."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._tokens: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self.num_tokens = 0
        """Generated tokens pushed so far (the prompt context is not counted)."""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text that became complete (maybe empty)."""
        if not token_ids:
            return ""
        self._tokens.extend(token_ids)
        self.num_tokens += len(token_ids)
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            # An incomplete character (or a special token that decodes to nothing): wait.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        return full_text[len(prefix_text) :]

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(
            token_ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )
