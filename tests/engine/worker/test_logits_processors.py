"""Each penalty and bias equals its reference on the same logits; rows that do not use one are untouched.

References: transformers' logits processors (RepetitionPenaltyLogitsProcessor,
SequenceBiasLogitsProcessor, MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
TemperatureLogitsWarper) and, for OpenAI's presence and frequency penalties (which
transformers lacks), OpenAI's published formula written out here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.outputs import ScheduledChunk
from engine.worker.logits_processors import (
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
    token_counts,
)
from shared.sampling import SamplingParams

V = 97
PROMPT = [3, 17, 17, 40, 96]
OUTPUT = [5, 17, 5, 5, 88]


def row(prompt: list[int] = PROMPT, output: list[int] = OUTPUT, **params: Any) -> ScheduledChunk:
    return ScheduledChunk("r", [1], 0, [0], True, SamplingParams(max_tokens=64, **params), len(output), None,
                          prompt, output)


def logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 4


def ids(tokens: list[int]) -> torch.Tensor:
    return torch.tensor([tokens])


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(penalty: float) -> None:
    lg = logits()
    want = RepetitionPenaltyLogitsProcessor(penalty)(ids(PROMPT + OUTPUT), lg.clone())
    got = lg.clone()
    apply_penalties(got, [row(repetition_penalty=penalty)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(("presence", "frequency"), [(0.7, 0.0), (0.0, 1.5), (-1.0, 0.4), (2.0, -2.0)])
def test_presence_and_frequency_follow_openais_formula(presence: float, frequency: float) -> None:
    lg = logits()
    want = lg.clone()
    for token in set(OUTPUT):  # over generated tokens only, as OpenAI and vLLM count them
        want[0, token] -= OUTPUT.count(token) * frequency + presence
    got = lg.clone()
    apply_penalties(got, [row(presence_penalty=presence, frequency_penalty=frequency)])
    torch.testing.assert_close(got, want)


def test_repetition_then_frequency_and_presence_together() -> None:
    lg = logits()
    want = RepetitionPenaltyLogitsProcessor(1.5)(ids(PROMPT + OUTPUT), lg.clone())
    for token in set(OUTPUT):
        want[0, token] -= OUTPUT.count(token) * 0.3 + 0.2
    got = lg.clone()
    apply_penalties(got, [row(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2)])
    torch.testing.assert_close(got, want)


def test_logit_bias_equals_transformers_sequence_bias() -> None:
    lg = logits()
    bias = ((4, 100.0), (17, -100.0), (60, 2.5))
    want = SequenceBiasLogitsProcessor({(t,): b for t, b in bias})(ids(PROMPT), lg.clone())
    got = lg.clone()
    apply_logit_bias(got, [row(logit_bias=bias)])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_equals_transformers(min_p: float) -> None:
    lg = logits()
    want = MinPLogitsWarper(min_p)(ids(PROMPT), lg.clone())
    got = apply_min_p(lg.clone(), [row(min_p=min_p)])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)])


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 10, 1.0), (1.3, 0, 0.8), (1.0, 20, 0.5)])
def test_temperature_top_k_top_p_keep_what_transformers_keeps(temperature: float, top_k: int, top_p: float) -> None:
    lg = logits()
    want = TemperatureLogitsWarper(temperature)(ids(PROMPT), lg.clone())
    if top_k:
        want = TopKLogitsWarper(top_k)(ids(PROMPT), want)
    want = TopPLogitsWarper(top_p)(ids(PROMPT), want) if top_p < 1.0 else want
    r = row(temperature=temperature, top_k=top_k, top_p=top_p)
    got = apply_top_k_top_p(apply_temperature(lg.clone(), [r]), [r])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)])


def test_rows_that_use_nothing_are_left_bit_for_bit() -> None:
    lg = logits(3, seed=1)
    rows = [row(), row(repetition_penalty=1.2, frequency_penalty=1.0, logit_bias=((1, 5.0),)), row()]
    got = lg.clone()
    apply_logit_bias(got, rows)
    apply_penalties(got, rows)
    got = apply_min_p(got, [row(), row(min_p=0.2), row()])
    assert torch.equal(got[0], lg[0]) and torch.equal(got[2], lg[2])
    assert not torch.equal(got[1], lg[1])


def test_a_batch_with_no_feature_launches_nothing() -> None:
    """No op runs when no row uses a transform: the logits object itself comes back untouched."""
    lg = logits(4)
    rows = [row() for _ in range(4)]
    with _count_torch_calls() as calls:
        apply_logit_bias(lg, rows)
        apply_penalties(lg, rows)
        assert apply_min_p(lg, rows) is lg
        assert apply_top_k_top_p(lg, rows) is lg
    assert calls == []


def test_token_counts_count_each_row_separately() -> None:
    counts = token_counts([[1, 1, 4], [], [0]], 6, torch.device("cpu"))
    assert counts.tolist() == [[0, 2, 0, 0, 1, 0], [0] * 6, [1, 0, 0, 0, 0, 0]]


class _count_torch_calls:  # noqa: N801 (used as a context manager, like a function)
    def __enter__(self) -> list[str]:
        from torch.overrides import TorchFunctionMode

        calls: list[str] = []

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                name = getattr(func, "__name__", str(func))
                if name != "__get__":  # attribute reads (.shape) launch nothing
                    calls.append(name)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return calls

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
