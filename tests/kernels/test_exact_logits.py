"""exact_logits (C, bfloat16) against exact_logits_reference: each row's near-maximum recomputed in float32.

The C pass converts the rounded logits, finds each row's candidates (within one bfloat16 unit of its
maximum) and recomputes them as float32 dot products. The candidates and every other value must
equal the reference's exactly; a recomputed value may differ in its float32 summation order only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pageserve_kernels import cpu_fused_bf16
from pageserve_kernels.cpu_fused import NativeFused
from pageserve_kernels.fused_ops import NEAR_MAX_LISTED, exact_logits
from pageserve_kernels.fused_reference import exact_logits_reference


@pytest.fixture(scope="module")
def native() -> NativeFused:
    kernels = cpu_fused_bf16.load()
    if kernels is None or not kernels.has_exact_logits:
        pytest.skip("no C compiler here (or PAGESERVE_NATIVE_KERNELS=0)")
    return kernels


def _product(rows: int, vocab: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A bfloat16 vocab product with logits around 20-30, where ties at the maximum are common."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(rows, hidden, generator=g) / hidden**0.5).bfloat16()
    w = (torch.randn(vocab, hidden, generator=g) * 3).bfloat16()
    w[:, 0] = (22 / h[:, 0].float().mean()).bfloat16()  # lifts every logit by about 22
    return F.linear(h, w), h, w


def _candidates(rounded: torch.Tensor) -> torch.Tensor:
    """(N, V) bool: values within one bfloat16 unit of their row's finite maximum, rows of at most NEAR_MAX_LISTED."""
    x = rounded.float()
    top = x.max(dim=1, keepdim=True).values
    _, e = torch.frexp(top)
    hits = (x >= top - torch.ldexp(torch.ones_like(top), e - 8)) & torch.isfinite(top)
    return hits & (hits.sum(dim=1, keepdim=True) <= NEAR_MAX_LISTED)


def _check(got: torch.Tensor, rounded: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> int:
    """Candidates are their float32 products (up to summation order), the rest the rounded values exactly."""
    mask = _candidates(rounded)
    torch.testing.assert_close(got[~mask], rounded.float()[~mask], rtol=0, atol=0, equal_nan=True)
    rows, cols = mask.nonzero(as_tuple=True)
    exact = (h[rows].double() * w[cols].double()).sum(dim=1).float()
    torch.testing.assert_close(got[mask], exact, rtol=2e-6, atol=0)
    return int(mask.sum())


@pytest.mark.parametrize("rows, vocab, hidden", [(1, 49152, 576), (8, 1000, 64), (64, 4099, 96), (3, 13, 8)])
def test_the_c_pass_equals_the_reference(native: NativeFused, rows: int, vocab: int, hidden: int) -> None:
    rounded, h, w = _product(rows, vocab, hidden, seed=rows + vocab)
    got = exact_logits(rounded, h, w, 8)
    assert got.dtype == torch.float32
    assert _check(got, rounded, h, w) >= rows  # every row's maximum at least is recomputed
    assert _check(exact_logits_reference(rounded, h, w, 8, NEAR_MAX_LISTED), rounded, h, w) >= rows


def test_rows_are_decided_alone(native: NativeFused) -> None:
    """A NaN row, an infinite one and a flat one keep their rounded values; the other rows are still refined."""
    rounded, h, w = _product(5, 300, 16, seed=3)
    rounded[1, 7] = float("nan")
    rounded[2] = float("-inf")
    rounded[3, 5] = float("inf")
    rounded[4] = 25.375  # flat: every value a candidate
    for got in (exact_logits(rounded, h, w, 8), exact_logits_reference(rounded, h, w, 8, NEAR_MAX_LISTED)):
        torch.testing.assert_close(got[1:], rounded[1:].float(), rtol=0, atol=0, equal_nan=True)
        assert _check(got, rounded, h, w) >= 1  # row 0 is refined whatever its neighbours hold
        assert (got[0] != rounded[0].float()).any()


def test_one_ulp_is_the_window_at_the_maximums_precision(native: NativeFused) -> None:
    """At 25.375 a bfloat16 step is 0.125: 25.25 is a candidate (its exact value may be above), 25.125 is not."""
    rounded = torch.tensor([[25.375, 25.25, 25.125, 1.0, -3.0, 25.3, 0.0, 0.0, 0.0]]).bfloat16()
    h = torch.ones(1, 1).bfloat16()
    w = torch.tensor([[25.5], [25.5], [25.5], [1.5], [-3.5], [25.5], [0.5], [0.5], [0.5]]).bfloat16()
    got = exact_logits(rounded, h, w, 8)
    assert (got != rounded.float())[0].nonzero().flatten().tolist() == [0, 1, 5]
