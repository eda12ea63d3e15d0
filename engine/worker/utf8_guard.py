"""Constrained samples stay well-formed UTF-8, whatever their grammar admits.

xgrammar 0.2.9 walks a grammar byte by byte, and where a grammar allows "any character"
(a JSON string, a regex's `.`, a negated class) it also takes the three bytes of a UTF-16
surrogate (ED A0..BF xx) as one character. No decoder reads those back as one: Python's
gives three U+FFFD, so a JSON string of maxLength 4 came out 6 characters long, and the
text was no longer the one the grammar checked (found by tests/engine/worker/test_structured_outputs.py).

So each constrained sample also carries the state of a UTF-8 decoder (RFC 3629's table of
well-formed byte sequences: 8 live states, one dead), and its step's bitmask is narrowed to
the tokens whose bytes keep that decoder alive. Per vocabulary, computed once (numpy, one
pass per byte column): the state after every token from every live state, and each live
state's allowed tokens as a bitmask in xgrammar's layout (bit t % 32 of int32 word t // 32).
Knows nothing about grammars.
"""

from __future__ import annotations

import numpy as np
import torch

START = 0  # between characters
_DEAD = 8
NUM_LIVE = 8


def _transitions() -> np.ndarray:
    """(9, 256): the decoder's next state per state and byte. States 1-7 wait for continuation
    bytes: 1 needs one more (80..BF); 2 two; 3 two after E0 (A0..BF first: no overlong form);
    4 two after ED (80..9F first: no surrogate); 5 three; 6 three after F0 (90..BF first);
    7 three after F4 (80..8F first: nothing past U+10FFFF)."""
    table = np.full((_DEAD + 1, 256), _DEAD, dtype=np.uint8)
    start = table[START]
    start[0x00:0x80] = START
    start[0xC2:0xE0] = 1
    start[0xE0], start[0xE1:0xF0], start[0xED] = 3, 2, 4
    start[0xF0], start[0xF1:0xF4], start[0xF4] = 6, 5, 7
    for state, (lo, hi), after in [(1, (0x80, 0xBF), START), (2, (0x80, 0xBF), 1), (3, (0xA0, 0xBF), 1),
                                   (4, (0x80, 0x9F), 1), (5, (0x80, 0xBF), 2), (6, (0x90, 0xBF), 2),
                                   (7, (0x80, 0x8F), 2)]:
        table[state, lo:hi + 1] = after
    return table


class Utf8Guard:
    """Which tokens keep a sample's bytes well-formed UTF-8, and the decoder state after each."""

    def __init__(self, token_bytes: list[bytes], bitmask_width: int) -> None:
        """token_bytes: each token id's bytes (xgrammar's TokenizerInfo.decoded_vocab); ids past it
        and tokens of no bytes (special tokens) leave the state as it is."""
        vocab = bitmask_width * 32
        self._after = _states_after(token_bytes[:vocab], vocab)  # (NUM_LIVE, vocab) uint8
        allowed = self._after != _DEAD
        bits = (allowed.reshape(NUM_LIVE, bitmask_width, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64))
        words = bits.sum(axis=2).astype(np.uint32).view(np.int32)
        self._allowed = torch.from_numpy(words)  # (NUM_LIVE, bitmask_width) int32

    def allowed(self, state: int) -> torch.Tensor:
        """The bitmask row of tokens that may follow `state`."""
        return self._allowed[state]

    def after(self, state: int, token: int) -> int:
        """The decoder's state once `token` follows `state` (a token outside the vocabulary: unchanged)."""
        if token >= self._after.shape[1]:
            return state
        nxt = int(self._after[state, token])
        return START if nxt == _DEAD else nxt  # a refused token was sampled anyway: start afresh


def _states_after(token_bytes: list[bytes], vocab: int) -> np.ndarray:
    """(NUM_LIVE, vocab): the state after each token from each live state."""
    table = _transitions()
    longest = max((len(b) for b in token_bytes), default=0)
    grid = np.zeros((vocab, max(longest, 1)), dtype=np.uint8)
    lengths = np.zeros(vocab, dtype=np.int64)
    for token, raw in enumerate(token_bytes):
        grid[token, :len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        lengths[token] = len(raw)
    out = np.empty((NUM_LIVE, vocab), dtype=np.uint8)
    for state in range(NUM_LIVE):
        states = np.full(vocab, state, dtype=np.uint8)
        for column in range(longest):
            states = np.where(column < lengths, table[states, grid[:, column]], states)
        out[state] = states
    return out
