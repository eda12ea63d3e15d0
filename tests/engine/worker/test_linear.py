"""engine/worker/layers/linear.py: per row bucket plans from measured choices, forced paths, one result."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.worker.layers import linear
from pageserve_kernels import choice


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")  # the compiled kernels stay cached
    monkeypatch.setattr(linear, "_PLANS", {})


def test_a_second_copy_is_kept_only_for_a_real_gain_then_each_bucket_runs_the_fastest_kept() -> None:
    picks = ["panel", "panel", "torch", "onednn", "onednn", "onednn"]
    timed = {1: {"panel": 1.0, "onednn": 1.05}, 4: {"panel": 1.0, "onednn": 1.5},
             16: {"panel": 1.0, "onednn": 0.5, "torch": 0.48}, 64: {"panel": 1.0, "onednn": 0.5},
             256: {"panel": 1.0, "onednn": 0.5}}  # 2048 rows: not timed
    # onednn is the main path; panel wins bucket 4 by 1.5x (kept), so bucket 1 runs it too (5% faster
    # there); torch wins bucket 16 by 4% (not worth a copy); bucket 2048 takes bucket 256's
    assert linear._with_hysteresis(picks, timed) == ("panel", "panel", "onednn", "onednn", "onednn", "onednn")
    assert linear._with_hysteresis(["onednn"] * 6, {}) == ("onednn",) * 6


def test_row_counts_map_to_the_nearest_timed_bucket() -> None:
    plan = linear.LinearPlan(linear._upper_rows(), ("a", "b", "c", "d", "e", "f"), {})
    assert [plan.impl_for(m) for m in (1, 2, 3, 8, 9, 31, 33, 128, 129, 724, 725, 100000)] == list("aabbccddeeff")


@pytest.mark.parametrize("impl", linear.candidates(torch.float32))
def test_a_forced_path_is_used_and_agrees_with_f_linear(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.FORCE_ENV, f"linear={impl}")
    weight, bias = torch.randn(40, 24), torch.randn(40)
    plan = linear.pack(weight)
    assert plan is not None and set(plan.impls) == {impl} and set(plan.packed) == {impl}
    for rows in (1, 7, 300):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(linear.linear(x, weight, plan, bias), F.linear(x, weight, bias))


def test_measured_plans_are_made_once_per_shape_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = choice.choose

    def counting(kind, key, names, timers, *a):  # noqa: ANN001, ANN202
        calls.append(key)
        return real(kind, key, names, timers, *a)

    monkeypatch.setattr(choice, "choose", counting)
    weight = torch.randn(32, 16)
    first = linear.pack(weight)
    linear.pack(torch.randn(32, 16))
    assert first is not None and len(calls) == len(linear.ROW_BUCKETS)
    assert all(impl in linear.candidates(torch.float32) for impl in first.impls)
    x = torch.randn(5, 16)
    torch.testing.assert_close(linear.linear(x, weight, first), F.linear(x, weight))


@pytest.mark.parametrize("impl", linear.candidates(torch.float32))
def test_packing_in_place_frees_a_raw_weight_no_bucket_reads(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bucket on a packed copy: the raw weight's elements go (its bytes once, not twice), the
    products stay. With F.linear in some bucket the raw weight is what it multiplies, so it stays."""
    monkeypatch.setenv(choice.FORCE_ENV, f"linear={impl}")
    original, bias = torch.randn(40, 24), torch.randn(40)
    weight = torch.nn.Parameter(original.clone(), requires_grad=False)
    plan = linear.pack_in_place(weight)
    assert plan is not None
    assert weight.numel() == (original.numel() if impl == "torch" else 0) and weight.dtype == original.dtype
    for rows in (1, 7, 300):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(linear.linear(x, weight, plan, bias), F.linear(x, original, bias))



def test_one_layout_keeps_the_layout_most_buckets_use() -> None:
    assert linear.one_layout(("panel", "panel", "onednn", "onednn", "onednn", "onednn")) == ("onednn",) * 6
    # amx multiplies panel's copy: panel's layout serves 3 buckets, its most-picked implementation the rest
    assert linear.one_layout(("amx", "amx", "panel", "onednn", "onednn", "torch")) == (
        "amx", "amx", "panel", "amx", "amx", "amx")
    assert linear.one_layout(("torch", "torch", "onednn", "onednn", "torch", "onednn")) == ("onednn",) * 6


def test_a_weight_packed_on_one_layout_costs_one_copy_and_multiplies_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    packed = [c for c in linear.candidates(torch.float32) if c != "torch"]
    if not packed:
        pytest.skip("no packed product on this host: one layout is all there is")
    monkeypatch.setattr(linear, "choose_impls", lambda n, k, dtype: ("torch",) * 2 + (packed[0],) * 4)
    weight = torch.randn(40, 24)
    assert linear.second_copy_bytes(weight) == weight.nbytes
    plan = linear.pack(weight, one_copy=True)
    assert plan is not None and set(plan.impls) == {packed[0]} and set(plan.packed) == {packed[0]}
    for rows in (1, 300):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(linear.linear(x, weight, plan), F.linear(x, weight))
