"""Token log probabilities as text: the engine's ids and numbers turned into what OpenAI's shapes hold.

The engine sends, per generated token, its logprob and the request's k most likely
alternatives as token ids (shared/protocol.py TokenLogprob: the raw model
distribution, vLLM V1's default). Here each id becomes its own text (decoded
alone, special tokens kept, so a token that is part of a multi-byte character
reads as U+FFFD as in vLLM) and its UTF-8 bytes, and each token gets its offset in
the choice's text (completions' text_offset). gateway/openai_format.py lays these
out as chat's `logprobs.content` or completions' `tokens`/`token_logprobs`/...
No torch, nothing about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gateway.detokenizer import Tokenizer
from shared.protocol import TokenLogprob


@dataclass(frozen=True)
class TokenText:
    token: str
    logprob: float


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token: its text and logprob, the alternatives, and where it starts."""

    token: str
    logprob: float
    top: list[TokenText]
    """The k most likely tokens, most likely first (k = top_logprobs / completions' logprobs)."""
    text_offset: int
    """Characters of the choice's text before this token (sum of the earlier tokens' texts)."""


class TokenTexts:
    """One request's id -> text conversion and per-choice running offsets."""

    def __init__(self, tokenizer: Tokenizer, num_choices: int) -> None:
        self._text = lru_cache(maxsize=4096)(lambda token_id: tokenizer.decode([token_id],
                                                                                skip_special_tokens=False))
        self._offsets = [0] * num_choices

    def text(self, token_id: int) -> str:
        """One id's own text (special tokens kept; part of a character reads as U+FFFD)."""
        return str(self._text(token_id))

    def entries(self, index: int, token_ids: list[int], logprobs: list[TokenLogprob]) -> list[LogprobEntry]:
        """Choice `index`'s new tokens with their logprobs (one TokenLogprob per token)."""
        out = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            token = self._text(token_id)
            top = [TokenText(self._text(t), v) for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)]
            out.append(LogprobEntry(token, lp.logprob, top, self._offsets[index]))
            self._offsets[index] += len(token)
        return out


def token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))
