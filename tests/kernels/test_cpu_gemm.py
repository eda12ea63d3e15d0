"""pageserve_kernels/cpu_gemm.py (the float32 AVX2 panel GEMM; bfloat16: test_cpu_gemm_bf16.py) against float64 products, and its place in engine/worker/layers/linear.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.worker.layers import linear as linear_mod
from pageserve_kernels import choice, cpu_gemm

native = cpu_gemm.load()
needs_native = pytest.mark.skipif(native is None, reason="no AVX2+FMA CPU or no C compiler: oneDNN path only")


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if bias is None else bias.double()).float()


def test_panels_hold_sixteen_columns_per_k_zero_padded() -> None:
    w = torch.randn(37, 5)
    p = cpu_gemm.pack_panels(w)
    assert p.panels.shape == (3, 5, 16) and (p.out_features, p.in_features) == (37, 5)
    for n in (0, 15, 16, 36):
        assert torch.equal(p.panels[n // 16, :, n % 16], w[n])
    assert not p.panels[2, :, 5:].any()  # columns 37..47 do not exist


@needs_native
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 64, 97, 200])
@pytest.mark.parametrize(("n", "k"), [(576, 576), (960, 576), (100, 37), (16, 1), (1536, 1536), (3, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_product(m: int, n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    bias = torch.randn(n, generator=g) if with_bias else None
    out = native.linear(x, cpu_gemm.pack_panels(w), bias)
    assert out.shape == (m, n)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=1e-5, atol=2e-5 * k**0.5)


@needs_native
def test_strided_rows_and_empty_batch() -> None:
    w = torch.randn(48, 20)
    base = torch.randn(9, 32)
    x = base[:, 4:24]  # rows 32 floats apart, 20 used
    torch.testing.assert_close(native.linear(x, cpu_gemm.pack_panels(w)), reference(x, w, None), rtol=1e-5, atol=1e-4)
    assert native.linear(torch.empty(0, 20), cpu_gemm.pack_panels(w)).shape == (0, 48)


def assert_batch_invariant(kernel: cpu_gemm.NativeGemm, dtype: torch.dtype, tile_rows: int) -> None:
    """A row's output has the same bits alone, anywhere in any batch, and on one thread or many."""
    x, w, bias = (torch.randn(70, 576).to(dtype), torch.randn(1000, 576).to(dtype), torch.randn(1000).to(dtype))
    packed = cpu_gemm.pack_panels(w)
    batch = kernel.linear(x, packed, bias)
    for i in (0, tile_rows - 1, tile_rows, 41, 69):  # first and last rows of tiles, a short last tile
        assert torch.equal(kernel.linear(x[i : i + 1], packed, bias)[0], batch[i])
    assert torch.equal(kernel.linear(x[3:50], packed, bias), batch[3:50])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = kernel.linear(x, packed, bias)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, batch)


@needs_native
def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count() -> None:
    assert_batch_invariant(native, torch.float32, 6)


@needs_native
def test_layers_offer_the_panel_gemm_for_float32_cpu_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_mod, "_PLANS", {})
    monkeypatch.setenv(choice.FORCE_ENV, "linear=panel")
    w, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(5, 24)
    packed = linear_mod.pack(w)
    assert packed is not None and isinstance(packed.packed["panel"], cpu_gemm.PanelWeight)
    torch.testing.assert_close(linear_mod.linear(x, w, packed, bias), reference(x, w, bias), rtol=1e-5, atol=1e-4)
    assert ("panel" in linear_mod.candidates(torch.bfloat16)) == (cpu_gemm.load(torch.bfloat16) is not None)
    assert "panel" not in linear_mod.candidates(torch.float16)  # no half-precision kernel


def test_without_the_kernel_layers_fall_back_to_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_gemm, "load", lambda dtype=torch.float32: None)
    monkeypatch.setattr(linear_mod, "_PLANS", {})
    monkeypatch.setenv(choice.FORCE_ENV, "linear=onednn")
    assert "panel" not in linear_mod.candidates(torch.float32)
    w, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(5, 24)
    packed = linear_mod.pack(w)
    assert packed is not None and set(packed.packed) == {"onednn"}
    torch.testing.assert_close(linear_mod.linear(x, w, packed, bias), reference(x, w, bias), rtol=1e-5, atol=1e-4)
