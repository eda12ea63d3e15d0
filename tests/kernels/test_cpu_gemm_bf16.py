"""pageserve_kernels/cpu_gemm.py's bfloat16 panel GEMM (AVX512-BF16) and its AMX twin against float64 products
of the same bfloat16 values, and their place in engine/worker/layers/linear.py and the C++ layers' product call."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from engine.worker.layers import linear as linear_mod
from pageserve_kernels import choice, cpu_gemm
from pageserve_kernels.cpu_features import cpu_flags
from tests.kernels.test_cpu_gemm import assert_batch_invariant

native = cpu_gemm.load(torch.bfloat16)
needs_native = pytest.mark.skipif(native is None, reason="no AVX512-BF16 CPU or no C compiler: oneDNN path only")
BF16 = torch.bfloat16
amx = cpu_gemm.load_amx()
needs_amx = pytest.mark.skipif(amx is None, reason="no AMX-BF16 on this CPU: the AVX512-BF16 kernel only")


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The exact product of the bfloat16 inputs, rounded once to bfloat16, back as float32."""
    out = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    return out.to(BF16).float()


def test_panels_hold_pairs_of_k_for_thirty_two_columns_zero_padded() -> None:
    w = torch.randn(37, 5).to(BF16)
    p = cpu_gemm.pack_panels(w)
    assert p.panels.shape == (2, 3, 32, 2) and (p.out_features, p.in_features) == (37, 5)
    for n in (0, 31, 32, 36):
        for k in range(5):
            assert torch.equal(p.panels[n // 32, k // 2, n % 32, k % 2], w[n, k])
    assert not p.panels[:, 2, :, 1].any()  # the pad of an odd K
    assert not p.panels[1, :, 5:].any()  # columns 37..63 do not exist


KERNELS = {"panel": native, "amx": amx}


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("m", [1, 2, 12, 13, 16, 17, 33, 64, 97, 300])
@pytest.mark.parametrize(("n", "k"), [(576, 576), (960, 576), (100, 37), (100, 64), (37, 32), (32, 1), (1536, 1536),
                                      (3, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_product_within_one_rounding(kernel: str, m: int, n: int, k: int, with_bias: bool) -> None:
    """Both kernels: the AVX512-BF16 one's 12-row tiles, the AMX one's 16-row tiles and 32-row blocks, whole and
    cut short, its 256-row chunks, last panels of a few columns, and K no multiple of 32 (AMX hands those on)."""
    gemm = KERNELS[kernel]
    if gemm is None:
        pytest.skip(f"no {kernel} kernel on this CPU (AVX512-BF16; AMX-BF16) or no C compiler")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=g).to(BF16), torch.randn(n, k, generator=g).to(BF16)
    bias = torch.randn(n, generator=g).to(BF16) if with_bias else None
    out = gemm.linear(x, cpu_gemm.pack_panels(w), bias)
    assert out.shape == (m, n) and out.dtype == BF16
    # float32 accumulation, then one rounding: at most one bfloat16 step (2^-7 relative) from the exact one
    torch.testing.assert_close(out.float(), reference(x, w, bias), rtol=2**-7, atol=1e-4 * k**0.5)


@needs_native
def test_an_odd_k_never_reads_past_its_row() -> None:
    """The last k of an odd K pairs with zero: the element after it (the next row's, or a NaN) counts for nothing."""
    w = torch.randn(40, 9).to(BF16)
    base = torch.full((6, 10), float("nan")).to(BF16)
    base[:, :9] = torch.randn(6, 9).to(BF16)
    out = native.linear(base[:, :9], cpu_gemm.pack_panels(w))
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), reference(base[:, :9], w, None), rtol=2**-7, atol=1e-3)
    assert native.linear(torch.empty(0, 9, dtype=BF16), cpu_gemm.pack_panels(w)).shape == (0, 40)


@pytest.mark.parametrize(("kernel", "tile_rows"), [("panel", 12), ("amx", 16)])
def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count(kernel: str, tile_rows: int) -> None:
    if KERNELS[kernel] is None:
        pytest.skip(f"no {kernel} kernel on this CPU")
    assert_batch_invariant(KERNELS[kernel], BF16, tile_rows)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_layers_run_each_kernel_over_the_one_panel_copy(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear.py packs panels once for either kernel (LAYOUT) and its product is the kernel's, bit for bit."""
    gemm = KERNELS[kernel]
    if gemm is None:
        pytest.skip(f"no {kernel} kernel on this CPU")
    monkeypatch.setattr(linear_mod, "_PLANS", {})
    monkeypatch.setenv(choice.FORCE_ENV, f"linear={kernel}")
    w, bias, x = torch.randn(40, 64).to(BF16), torch.randn(40).to(BF16), torch.randn(5, 64).to(BF16)
    packed = linear_mod.pack(w)
    assert packed is not None and set(packed.impls) == {kernel} and set(packed.packed) == {"panel"}
    out = linear_mod.linear(x, w, packed, bias)
    assert torch.equal(out, gemm.linear(x, packed.packed["panel"], bias))  # type: ignore[arg-type]
    torch.testing.assert_close(out.float(), reference(x, w, bias), rtol=2**-7, atol=1e-3)


def test_the_amx_product_is_offered_exactly_where_the_cpu_has_amx() -> None:
    assert (amx is not None) == (native is not None and {"amx_bf16", "amx_tile"} <= cpu_flags())
    assert ("amx" in linear_mod.candidates(BF16)) == (amx is not None)
    assert "amx" not in linear_mod.candidates(torch.float32)


@needs_amx
def test_amx_reads_strided_rows_and_nothing_past_the_last_one() -> None:
    """A short last tile reads zero rows, not the memory after x (here NaN, which zero would not cancel)."""
    w = torch.randn(64, 64).to(BF16)
    base = torch.full((8, 96), float("nan")).to(BF16)
    base[:5, 16:80] = torch.randn(5, 64).to(BF16)
    x = base[:5, 16:80]  # rows 96 apart; the rest NaN
    out = amx.linear(x, cpu_gemm.pack_panels(w))
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), reference(x, w, None), rtol=2**-7, atol=1e-3)


GUARDED_ROWS = textwrap.dedent("""
    import ctypes, mmap, torch
    from pageserve_kernels import cpu_gemm
    page, k, rows = mmap.PAGESIZE, 64, 5
    buf = mmap.mmap(-1, 2 * page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(start + page), ctypes.c_size_t(page), 0) == 0  # PROT_NONE
    x = torch.frombuffer(buf, dtype=torch.bfloat16, count=page // 2)[-rows * k:].view(rows, k)  # ends at the guard
    x.copy_(torch.randn(rows, k).to(torch.bfloat16))
    out = cpu_gemm.load_amx().linear(x, cpu_gemm.pack_panels(torch.randn(32, k).to(torch.bfloat16)))
    print(bool(torch.isfinite(out.float()).all()))
""")


@needs_amx
def test_amx_never_reads_a_row_past_the_batch() -> None:
    """x's last row ends where an unreadable page begins: a 16-row tile loaded from x itself would fault."""
    done = subprocess.run([sys.executable, "-c", GUARDED_ROWS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-1] == "True", done.stderr[-2000:]
