"""pageserve_kernels/cpu_fused_bf16.py against the PyTorch references of pageserve_kernels/fused_ops.py, in bfloat16.

The mixed-precision rule both follow: the residual stream and the rotary tables are float32, each op
rounds its bfloat16 output once (pageserve_kernels/fused_reference.py)."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels import choice, cpu_fused_bf16, fused_choice, fused_ops
from pageserve_kernels.cpu_fused import NativeFused
from pageserve_kernels.fused_ops import (
    fused_add_rms_norm_reference,
    rms_norm_reference,
    rotary_reference,
    silu_and_mul_reference,
)

ROWS = [1, 7, 300]
HIDDEN = [576, 100, 13]  # SmolLM2, and sizes that leave vector tails


@pytest.fixture(scope="module")
def native() -> NativeFused:
    kernels = cpu_fused_bf16.load()
    if kernels is None:
        pytest.skip("no C compiler here (or PAGESERVE_NATIVE_KERNELS=0)")
    return kernels


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return _randn32(*shape, seed=seed, scale=scale).bfloat16()


def _randn32(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def assert_matches(got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
    """Equal bit for bit; where a float32 sum order differs (the norm), within one bfloat16 unit."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    if exact:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
        assert (got == want).float().mean() > 0.98


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm(native: NativeFused, rows: int, hidden: int) -> None:
    x, w = _randn32(rows, hidden, seed=1, scale=3.0), _randn(hidden, seed=2)  # x: the float32 stream
    assert_matches(native.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5), exact=False)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_add_rms_norm_updates_both_in_place(native: NativeFused, rows: int, hidden: int) -> None:
    x, residual, w = _randn(rows, hidden, seed=3), _randn32(rows, hidden, seed=4), _randn(hidden, seed=5)
    want, want_residual = fused_add_rms_norm_reference(x, residual, w, 1e-6)
    got, got_residual = x.clone(), residual.clone()
    native.add_rms_norm_(got, got_residual, w, 1e-6)
    assert got_residual.dtype == torch.float32 and torch.equal(got_residual, want_residual)  # float32 add: exact
    assert_matches(got, want, exact=False)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("intermediate", [1536, 50, 7])
def test_silu_and_mul(native: NativeFused, rows: int, intermediate: int) -> None:
    gate_up = _randn(rows, 2 * intermediate, seed=6, scale=4.0)
    assert_matches(native.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), exact=False)


def test_silu_and_mul_at_the_ends_of_exp(native: NativeFused) -> None:
    g = torch.tensor([[-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, 1e30]]).bfloat16()
    gate_up = torch.cat([g, torch.ones_like(g)], dim=1)
    assert_matches(native.silu_and_mul(gate_up), silu_and_mul_reference(gate_up))


@pytest.mark.parametrize(("rows", "heads", "hd"), [(1, 15, 64), (7, 3, 16), (300, 12, 64)])
def test_rotary_in_place_on_a_slice_of_qkv(native: NativeFused, rows: int, heads: int,
                                           hd: int) -> None:
    qkv = _randn(rows, (heads + 1) * hd, seed=7)
    qk = qkv[:, : heads * hd].view(rows, heads, hd)
    angles = torch.rand(rows, 1, hd // 2, generator=torch.Generator().manual_seed(8)) * 6
    cos = torch.cat([angles.cos(), angles.cos()], -1)  # float32 tables, as RotaryEmbedding keeps them
    sin = torch.cat([-angles.sin(), angles.sin()], -1)
    want, untouched = rotary_reference(qk, cos, sin), qkv[:, heads * hd:].clone()
    native.rotary_(qk, cos, sin)
    assert_matches(qk, want)
    assert torch.equal(qkv[:, heads * hd:], untouched)


@pytest.mark.parametrize("pick", ["c", "torch"])
def test_fused_ops_route_bfloat16_as_chosen(native: NativeFused, pick: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_choice, "_PICKS", {})
    monkeypatch.setenv(choice.FORCE_ENV, f"fused_rms_norm={pick},fused_silu_and_mul={pick}")
    calls: list[str] = []
    for name in ("rms_norm", "silu_and_mul"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    x, w = _randn32(4, 64, seed=9), _randn(64, seed=10)
    assert_matches(fused_ops.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5), exact=False)
    gate_up = _randn(4, 64, seed=11)
    assert_matches(fused_ops.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), exact=False)
    assert calls == (["rms_norm", "silu_and_mul"] if pick == "c" else [])


def test_the_faster_implementation_is_measured_once_per_op_and_width(native: NativeFused,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_choice, "_PICKS", {})
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    keys: list[str] = []
    monkeypatch.setattr(choice, "choose", lambda kind, key, names, timers: keys.append(key) or choice.Choice(
        "torch" if sorted(timers()) == ["c", "torch"] else "?"))
    for rows in (1, 7):
        fused_ops.silu_and_mul(_randn(rows, 64, seed=12))
    fused_ops.silu_and_mul(_randn(3, 96, seed=13))
    assert keys == ["bfloat16 width=[64] rows=64", "bfloat16 width=[96] rows=64"]
