"""float32 products x @ W^T on the CPU, W prepacked into 16-column panels (AVX2 + FMA, C).

Why our own GEMM: a decode step makes 121 products (four per layer and the vocab
product) at 1-64 rows, and oneDNN spends tens of microseconds of each call outside
the arithmetic. Over the 30 layers of SmolLM2-135M with cold weights, as in a
step, this kernel is 1.3-1.5x faster than the oneDNN-packed product at every
decode row count (1 to 64) and about even at 256-2048 prompt rows
(`python -m ops.bench.kernels.gemm`).

Layout: W (N, K) becomes panels (ceil(N/16), K, 16): panel p holds output columns
16p..16p+15 as one row of 16 per k (zero-padded past N), so the micro-kernel reads
them contiguously. The micro-kernel computes 6 rows x 16 columns in twelve
registers: per k, two vector loads of the panel, six broadcasts of x, twelve FMAs.

Every output element is one FMA chain over k = 0..K-1 in order, whatever the row
count, the row's position in the batch or the thread count: a request's logits do
not depend on which other requests share its step (batch invariance).

OpenMP spreads (row chunk, panel) pairs over torch's threads; row chunks of at most
96 rows keep a chunk of x in L2 while the panels stream past it.

The source (pageserve_kernels/csrc/gemm_f32.c) is compiled on first use (pageserve_kernels/native_build.py); without AVX2+FMA,
a compiler, or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and
engine/worker/layers/linear.py keeps oneDNN.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from pageserve_kernels import native_build
from pageserve_kernels.cpu_features import has_avx2_fma

PANEL = 16  # output columns per panel: two AVX2 vectors



@dataclass(frozen=True)
class PanelWeight:
    """A (N, K) float32 weight prepacked for `NativeGemm.linear`."""

    panels: torch.Tensor  # (ceil(N/16), K, 16) contiguous, zero past column N
    out_features: int
    in_features: int


def pack_panels(weight: torch.Tensor) -> PanelWeight:
    n, k = weight.shape
    n_pad = -(-n // PANEL) * PANEL
    padded = torch.zeros(n_pad, k, dtype=torch.float32)
    padded[:n] = weight
    return PanelWeight(padded.view(n_pad // PANEL, PANEL, k).transpose(1, 2).contiguous(), n, k)


class NativeGemm:
    """ctypes binding of the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fn = lib.gemm_f32
        self._fn.restype, self._fn.argtypes = None, [p, i, p, p, p, i, i, i, ctypes.c_int]

    def address(self) -> int:
        """The C function, for pageserve_kernels/csrc/llama_layers.cpp."""
        return native_build.address(self._fn)

    def linear(self, x: torch.Tensor, w: PanelWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(T, K) -> (T, N): x @ W^T (+ bias)."""
        assert x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == w.in_features
        if x.stride(1) != 1 or x.stride(0) < w.in_features:
            x = x.contiguous()
        if bias is not None:
            assert bias.dtype == torch.float32 and bias.shape == (w.out_features,)
            bias = bias.contiguous()
        m = x.shape[0]
        out = torch.empty(m, w.out_features, dtype=torch.float32)
        if m:
            self._fn(x.data_ptr(), x.stride(0), w.panels.data_ptr(), None if bias is None else bias.data_ptr(),
                     out.data_ptr(), m, w.out_features, w.in_features, torch.get_num_threads())
        return out


@functools.cache
def load() -> NativeGemm | None:
    """The compiled kernel, or None without AVX2+FMA, when disabled, or where no C compiler works."""
    if not has_avx2_fma():
        return None
    lib = native_build.try_load_kernel("gemm_f32", native_build.EXACT_FLAGS)
    return None if lib is None else NativeGemm(lib)
