"""bench agreement's measure: first-token and before-divergence shares against the reference."""

from __future__ import annotations

import pytest

from ops.bench.agreement import agreement


def test_identical_outputs_agree_fully() -> None:
    ref = [[1, 2, 3], [4, 5]]
    a = agreement("same", [list(r) for r in ref], ref)
    assert (a.first_token, a.prefix) == (1.0, 1.0)


def test_tokens_after_the_first_divergence_do_not_count() -> None:
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    # request 0 diverges at its third token and agrees again later; request 1 at its first
    a = agreement("x", [[1, 2, 9, 4], [0, 6, 7, 8]], ref)
    assert a.first_token == pytest.approx(0.5)
    assert a.prefix == pytest.approx(2 / 8)


def test_a_short_output_counts_as_diverged_where_it_stops() -> None:
    a = agreement("short", [[1]], [[1, 2, 3]])
    assert a.prefix == pytest.approx(1 / 3)
