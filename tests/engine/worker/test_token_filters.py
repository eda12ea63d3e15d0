"""allowed_token_ids and bad_words (vLLM's) against transformers' processors on the same logits.

References: SuppressTokensLogitsProcessor over the complement of the allowed ids, and
NoBadWordsLogitsProcessor given the output ids (vLLM matches bad words against the output only).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.logits_process import NoBadWordsLogitsProcessor, SuppressTokensLogitsProcessor

from engine.outputs import ScheduledChunk
from engine.worker.logits_processors import apply_allowed_tokens, apply_bad_words
from engine.worker.sampler import Sampler
from shared.sampling import SamplingParams

V = 97
OUTPUT = [5, 17, 5, 40]


def row(output: list[int] = OUTPUT, **params: Any) -> ScheduledChunk:
    return ScheduledChunk("r", [1], 0, [0], True, SamplingParams(max_tokens=64, **params), len(output), None,
                          [3, 4], output)


def logits(rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(0)) * 4


def test_allowed_token_ids_equal_suppressing_every_other_id() -> None:
    lg = logits()
    allowed = (4, 17, 60)
    others = [t for t in range(V) if t not in allowed]
    want = SuppressTokensLogitsProcessor(others, device="cpu")(torch.tensor([OUTPUT]), lg.clone())
    got = lg.clone()
    apply_allowed_tokens(got, [row(allowed_token_ids=allowed)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bad_words_equal_transformers_no_bad_words() -> None:
    lg = logits()
    words = ((9,), (5, 40, 12), (17, 5, 40, 33), (17, 50), (1, 2, 3))  # 9 always; 12 and 33 match; 50, 3 not
    want = NoBadWordsLogitsProcessor([list(w) for w in words], eos_token_id=None)(torch.tensor([OUTPUT]), lg.clone())
    got = lg.clone()
    apply_bad_words(got, [row(bad_words_token_ids=words)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.isinf(got[0, [9, 12, 33]]).all() and torch.isfinite(got[0, [50, 3]]).all()


def test_rows_without_the_filters_are_untouched() -> None:
    lg = logits(2)
    got = lg.clone()
    rows = [row(allowed_token_ids=(4,), bad_words_token_ids=((9,),)), row()]
    apply_allowed_tokens(got, rows)
    apply_bad_words(got, rows)
    torch.testing.assert_close(got[1], lg[1], rtol=0, atol=0)


def test_the_sampler_draws_only_allowed_ids_and_never_a_bad_word() -> None:
    sampler = Sampler(seed=1)
    rows = [row(allowed_token_ids=(4, 17, 60), temperature=1.0), row(bad_words_token_ids=((17, 5, 40, 7),))]
    for _ in range(20):
        lg = torch.zeros(2, V)
        lg[1, 7] = 50.0  # the bad word's last token would win every draw
        tokens = sampler.sample(lg, rows)
        assert tokens[0] in (4, 17, 60)
        assert tokens[1] != 7
