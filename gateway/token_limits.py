"""The gateway's token-id checks against the engine's model: a 400 naming `param` before any quota.

The engine checks the same ids again at admission (engine/scheduling/request_checks.py): it
serves any socket client. Here the client gets the clearer error without a round
trip. The vocabulary size is the engine's (`ModelInfo.vocab_size`, carried by Ready), the tokenizer's
only when an older engine did not announce one. Knows nothing about HTTP bodies.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.errors import InvalidRequest


def vocab_size_of(announced: int, tokenizer_vocab: int) -> int:
    """The engine's vocabulary (what its embedding and logits hold), else the tokenizer's."""
    return announced if announced > 0 else tokenizer_vocab


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Every id in [0, vocab_size), or a 400 naming the first one outside."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise InvalidRequest(f"token id {bad} is outside the vocabulary (size {vocab_size})", param=param,
                             code="invalid_value")
