"""pageserve_kernels/cpu_fused.py against the PyTorch references in pageserve_kernels/fused_ops.py, on odd shapes.

On an AVX2 CPU the C results equal PyTorch's bit for bit; the tolerances
leave room for other vector widths (ATen's sum order differs on AVX-512).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pageserve_kernels import cpu_fused, fused_ops
from pageserve_kernels.fused_ops import (
    fused_add_rms_norm_reference,
    rms_norm_reference,
    rotary_reference,
    silu_and_mul_reference,
)

TOL = {"rtol": 2e-6, "atol": 1e-6}
ROWS = [1, 7, 64, 300]
HIDDEN = [576, 4096, 100, 13]  # SmolLM2, Llama-7B, and sizes that leave vector tails


@pytest.fixture(scope="module")
def native() -> cpu_fused.NativeFused:
    kernels = cpu_fused.load()
    if kernels is None:
        pytest.skip("no C compiler here (or PAGESERVE_NATIVE_KERNELS=0)")
    return kernels


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm(native: cpu_fused.NativeFused, rows: int, hidden: int) -> None:
    x, w = _randn(rows, hidden, seed=0, scale=3.0), _randn(hidden, seed=1)
    torch.testing.assert_close(native.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5), **TOL)


def test_rms_norm_reads_strided_rows(native: cpu_fused.NativeFused) -> None:
    x, w = _randn(9, 2 * 576, seed=2)[:, :576], _randn(576, seed=3)  # row stride 1152
    torch.testing.assert_close(native.rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), **TOL)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_updates_both_in_place(native: cpu_fused.NativeFused, rows: int, hidden: int) -> None:
    x, residual, w = _randn(rows, hidden, seed=4), _randn(rows, hidden, seed=5, scale=4.0), _randn(hidden, seed=6)
    want_x, want_residual = fused_add_rms_norm_reference(x, residual, w, 1e-5)
    native.add_rms_norm_(x, residual, w, 1e-5)
    torch.testing.assert_close(residual, want_residual, rtol=0, atol=0)  # one float add: exact anywhere
    torch.testing.assert_close(x, want_x, **TOL)


@pytest.mark.parametrize("intermediate", [1536, 11008, 100, 7])
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul(native: cpu_fused.NativeFused, rows: int, intermediate: int) -> None:
    gate_up = _randn(rows, 2 * intermediate, seed=7, scale=4.0)
    torch.testing.assert_close(native.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), **TOL)


def test_silu_and_mul_at_the_ends_of_exp(native: cpu_fused.NativeFused) -> None:
    """exp(-x) over- and underflows: silu(x) is -0 far left, x far right, as in PyTorch."""
    gate_up = torch.cat([torch.linspace(-200, 200, 4096), torch.linspace(-3, 3, 4096)]).view(1, -1)
    torch.testing.assert_close(native.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), **TOL)


def test_silu_and_mul_reads_strided_rows(native: cpu_fused.NativeFused) -> None:
    gate_up = _randn(5, 4 * 96, seed=8)[:, : 2 * 96]
    torch.testing.assert_close(native.silu_and_mul(gate_up), silu_and_mul_reference(gate_up), **TOL)


@pytest.mark.parametrize(("heads", "head_dim"), [(12, 64), (40, 128), (3, 32), (2, 12), (5, 6)])
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_in_place_on_a_slice_of_qkv(native: cpu_fused.NativeFused, rows: int, heads: int,
                                           head_dim: int) -> None:
    """q|k heads rotated where they lie in the fused qkv product (rows strided by v's width too)."""
    qkv = _randn(rows, (heads + 2) * head_dim, seed=9, scale=2.0)
    angles = _randn(rows, head_dim // 2, seed=10, scale=100.0)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).unsqueeze(1)  # (T, 1, hd)
    sin_signed = torch.cat((-angles.sin(), angles.sin()), dim=-1).unsqueeze(1)
    qk = qkv[:, : heads * head_dim].view(rows, heads, head_dim)
    want = rotary_reference(qk, cos, sin_signed)
    v_before = qkv[:, heads * head_dim :].clone()
    native.rotary_(qk, cos, sin_signed)
    torch.testing.assert_close(qk, want, **TOL)
    assert torch.equal(qkv[:, heads * head_dim :], v_before)


@pytest.mark.parametrize("vocab", [49152, 100, 13, 1])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_argmax(native: cpu_fused.NativeFused, rows: int, vocab: int) -> None:
    logits = _randn(rows, vocab, seed=21, scale=5.0)
    assert torch.equal(native.argmax(logits), logits.argmax(-1))


def test_argmax_follows_torch_on_ties_infinities_and_nan(native: cpu_fused.NativeFused) -> None:
    logits = torch.zeros(6, 37)
    logits[0, [5, 30]] = 2.0  # a tie: the first index
    logits[1] = float("-inf")  # nothing but -inf: index 0
    logits[2, [3, 20]] = float("inf")
    logits[3, 33], logits[3, 35] = 9.0, float("nan")  # a NaN beats any number
    logits[4, [17, 8]] = float("nan")
    logits[5, 0], logits[5, 1] = -0.0, 0.0  # -0 == +0: the first
    assert native.argmax(logits).tolist() == logits.argmax(-1).tolist() == [5, 0, 3, 35, 8, 0]
    strided = _randn(5, 2 * 50, seed=22)[:, :50]
    assert torch.equal(native.argmax(strided), strided.argmax(-1))


def test_without_the_library_every_op_is_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_fused, "load", lambda: None)
    x, residual, w = _randn(7, 100, seed=11), _randn(7, 100, seed=12), _randn(100, seed=13)
    assert torch.equal(fused_ops.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
    got, got_residual = fused_ops.fused_add_rms_norm(x.clone(), residual.clone(), w, 1e-5)
    want, want_residual = fused_add_rms_norm_reference(x, residual, w, 1e-5)
    assert torch.equal(got, want) and torch.equal(got_residual, want_residual)
    gate_up = _randn(7, 200, seed=14)
    assert torch.equal(fused_ops.silu_and_mul(gate_up), silu_and_mul_reference(gate_up))
    qk, cos, sin = _randn(7, 3, 16, seed=15), _randn(7, 1, 16, seed=16), _randn(7, 1, 16, seed=17)
    assert torch.equal(fused_ops.rotate_qk(qk.clone(), cos, sin), rotary_reference(qk, cos, sin))
    assert torch.equal(fused_ops.argmax_rows(gate_up), gate_up.argmax(-1))


def test_other_dtypes_keep_the_reference() -> None:
    """float16 (HF's rounding of the normalised value before the weight) never reaches the C kernels."""
    x, w = _randn(4, 64, seed=18).half(), _randn(64, seed=19).half()
    assert torch.equal(fused_ops.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
    gate_up = _randn(4, 64, seed=20).half()
    assert torch.equal(fused_ops.silu_and_mul(gate_up), silu_and_mul_reference(gate_up))


def test_native_kernels_off_means_no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGESERVE_NATIVE_KERNELS", "0")
    cpu_fused.load.cache_clear()
    try:
        assert cpu_fused.load() is None
    finally:
        cpu_fused.load.cache_clear()


def test_loading_the_library_keeps_subnormals(native: cpu_fused.NativeFused) -> None:
    """A fresh process: no flag of ours may turn on flush-to-zero (as -ffast-math would)."""
    code = (
        "from pageserve_kernels import cpu_fused\n"
        "assert cpu_fused.load() is not None\n"
        "print(2.2250738585072014e-308 / 4 != 0.0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_benchmark_script_runs(native: cpu_fused.NativeFused, capsys: pytest.CaptureFixture[str]) -> None:
    from ops.bench.kernels import fused as bench_fused

    assert bench_fused.main(["--rows", "3", "--repeat", "5"]) == 0
    assert "silu_and_mul" in capsys.readouterr().out
