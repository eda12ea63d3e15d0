"""near_max_rows (C) against near_max_reference: the candidates for a row's maximum before a rounding."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels import cpu_fused
from pageserve_kernels.fused_ops import NEAR_MAX_LISTED, near_max_candidates
from pageserve_kernels.fused_reference import near_max_reference


@pytest.fixture(scope="module")
def native() -> cpu_fused.NativeFused:
    kernels = cpu_fused.load()
    if kernels is None or not kernels.has_near_max:
        pytest.skip("no C compiler here (or PAGESERVE_NATIVE_KERNELS=0)")
    return kernels


def _rounded_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """bfloat16-rounded logits around 20-30, as a vocab product gives: ties at the maximum are common."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 3 + 22).bfloat16().float()


@pytest.mark.parametrize("rows, vocab", [(1, 49152), (8, 1000), (64, 49152), (3, 13)])
def test_the_c_pass_lists_what_the_reference_lists(native: cpu_fused.NativeFused, rows: int, vocab: int) -> None:
    x = _rounded_logits(rows, vocab, seed=rows + vocab)
    x[0, vocab // 2] = x[0].max()  # a planted tie in the middle, past the vector part's first blocks
    expected = near_max_reference(x, 8, NEAR_MAX_LISTED)
    got = near_max_candidates(x, 8)
    assert expected is not None and got is not None
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert (got[0] == 0).sum() >= 2  # the planted tie is listed with the maximum


def test_nan_and_infinite_rows_have_no_candidates_and_flat_rows_none(native: cpu_fused.NativeFused) -> None:
    x = _rounded_logits(4, 300, seed=1)
    x[1, 7] = float("nan")
    x[2] = float("-inf")
    x[3, 5] = float("inf")
    got, expected = near_max_candidates(x, 8), near_max_reference(x, 8, NEAR_MAX_LISTED)
    assert got is not None and expected is not None
    assert torch.equal(got[0], expected[0]) and set(got[0].tolist()) == {0}
    flat = torch.full((2, 100), 25.375)
    assert near_max_candidates(flat, 8) is None and near_max_reference(flat, 8, NEAR_MAX_LISTED) is None


def test_one_ulp_is_the_window_at_the_maximums_precision(native: cpu_fused.NativeFused) -> None:
    """At 25.375 a bfloat16 step is 0.125: 25.25 is a candidate (its exact value may be above), 25.125 is not."""
    x = torch.tensor([[25.375, 25.25, 25.125, 1.0, -3.0, 25.3, 0.0, 0.0, 0.0]])
    rows, cols = near_max_candidates(x, 8)
    assert cols.tolist() == [0, 1, 5] and rows.tolist() == [0, 0, 0]
