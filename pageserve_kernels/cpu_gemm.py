"""Products x @ W^T on the CPU, W prepacked into column panels: float32 (AVX2 + FMA) and bfloat16
(AVX512-BF16 dot products, float32 accumulation), in C.

Why our own GEMM: a decode step makes 121 products (four per layer and the vocab
product) at 1-64 rows, and oneDNN spends tens of microseconds of each call outside
the arithmetic. Over the 30 layers of SmolLM2-135M with cold weights, as in a
step, the float32 kernel is 1.3-1.5x faster than the oneDNN-packed product at every
decode row count (1 to 64) and about even at 256-2048 prompt rows; the bfloat16
kernel 1.1-1.6x at 1-64 rows and 0.9x from 128 rows (AMD EPYC Zen 4;
`python -m ops.bench.kernels.gemm [--dtype bfloat16]`). engine/worker/layers/linear.py
times both against oneDNN per row bucket on the host it runs on.

float32 layout: W (N, K) becomes panels (ceil(N/16), K, 16): panel p holds output columns
16p..16p+15 as one row of 16 per k (zero-padded past N), so the micro-kernel reads
them contiguously. The micro-kernel computes 6 rows x 16 columns in twelve
registers: per k, two vector loads of the panel, six broadcasts of x, twelve FMAs.

bfloat16 layout: panels (ceil(N/32), ceil(K/2), 32, 2): per pair of k, the 32 columns'
two weights side by side, which is what a dot-product instruction multiplies with a
broadcast pair of x. The micro-kernel computes 12 rows x 32 columns in 24 registers,
rounding to bfloat16 once at the end. On hosts with AMX, `load_amx()` runs the same product over
the same panels on tiles (a panel's 16 pairs of 16 columns are a tile as they lie): blocks of 32 rows
x 32 columns in four float32 tiles. Intel Xeon with AMX, 2 vCPUs, `python -m ops.bench.kernels.gemm
--dtype bfloat16` (a step's 120 products, weights from memory), against oneDNN's packed product:
1.27-1.34x at 1-32 rows, 1.06x at 64, 0.83x at 256 and 0.42x at 2,048 (linear.py keeps oneDNN there).

Every output element is one chain over k = 0..K-1 in order (pairs of k for bfloat16),
whatever the row count, the row's position in the batch or the thread count: a
request's logits do not depend on which other requests share its step (batch invariance).

OpenMP spreads (row chunk, panel) pairs over torch's threads; row chunks of at most
96 rows keep a chunk of x in L2 while the panels stream past it.

The sources (pageserve_kernels/csrc/gemm_f32.c, gemm_bf16.c) are compiled on first use
(pageserve_kernels/native_build.py); without the instructions, a compiler, or with
PAGESERVE_NATIVE_KERNELS=0, `load(dtype)` returns None and engine/worker/layers/linear.py keeps oneDNN.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from pageserve_kernels import native_build
from pageserve_kernels.cpu_features import cpu_flags, has_avx2_fma

PANEL = {torch.float32: 16, torch.bfloat16: 32}  # output columns per panel: two vectors
_KERNELS = {torch.float32: "gemm_f32", torch.bfloat16: "gemm_bf16"}


@dataclass(frozen=True)
class PanelWeight:
    """A (N, K) weight prepacked for `NativeGemm.linear`."""

    panels: torch.Tensor  # float32 (ceil(N/16), K, 16) or bfloat16 (ceil(N/32), ceil(K/2), 32, 2); zero padded
    out_features: int
    in_features: int


def pack_panels(weight: torch.Tensor) -> PanelWeight:
    n, k = weight.shape
    width = PANEL[weight.dtype]
    n_pad = -(-n // width) * width
    if weight.dtype == torch.float32:
        padded = torch.zeros(n_pad, k, dtype=weight.dtype)
        padded[:n] = weight
        return PanelWeight(padded.view(n_pad // width, width, k).transpose(1, 2).contiguous(), n, k)
    pairs = -(-k // 2)
    padded = torch.zeros(n_pad, 2 * pairs, dtype=weight.dtype)
    padded[:n, :k] = weight
    return PanelWeight(padded.view(n_pad // width, width, pairs, 2).permute(0, 2, 1, 3).contiguous(), n, k)


class NativeGemm:
    """ctypes binding of one dtype's compiled kernel (`function`: another entry with the same signature)."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype, function: str | None = None) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self.dtype, self.lib = dtype, lib
        self._fn = getattr(lib, function or _KERNELS[dtype])
        self._fn.restype, self._fn.argtypes = None, [p, i, p, p, p, i, i, i, ctypes.c_int]

    def address(self) -> int:
        """The C function, for pageserve_kernels/csrc/llama_layers.cpp (both dtypes' share a signature)."""
        return native_build.address(self._fn)

    def linear(self, x: torch.Tensor, w: PanelWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(T, K) -> (T, N): x @ W^T (+ bias), in the kernel's dtype."""
        assert x.dtype == self.dtype == w.panels.dtype and x.dim() == 2 and x.shape[1] == w.in_features
        if x.stride(1) != 1 or x.stride(0) < w.in_features:
            x = x.contiguous()
        if bias is not None:
            assert bias.dtype == self.dtype and bias.shape == (w.out_features,)
            bias = bias.contiguous()
        m = x.shape[0]
        out = torch.empty(m, w.out_features, dtype=self.dtype)
        if m:
            self._fn(x.data_ptr(), x.stride(0), w.panels.data_ptr(), None if bias is None else bias.data_ptr(),
                     out.data_ptr(), m, w.out_features, w.in_features, torch.get_num_threads())
        return out


@functools.cache
def load(dtype: torch.dtype = torch.float32) -> NativeGemm | None:
    """The compiled kernel for `dtype`, or None: no kernel for the dtype, the CPU lacks its instructions
    (AVX2+FMA; AVX-512 and AVX512-BF16), disabled, or no C compiler works."""
    has_instructions = {torch.float32: has_avx2_fma, torch.bfloat16: lambda: {"avx512f", "avx512_bf16"} <= cpu_flags()}
    if dtype not in _KERNELS or not has_instructions[dtype]():
        return None
    lib = native_build.try_load_kernel(_KERNELS[dtype], native_build.EXACT_FLAGS)
    return None if lib is None else NativeGemm(lib, dtype)


@functools.cache
def load_amx() -> NativeGemm | None:
    """The bfloat16 product on AMX tiles over the same panels (gemm_bf16_amx), or None: no AMX-BF16 here,
    no bfloat16 kernel, or Linux refused the process the tiles' state."""
    bf16 = load(torch.bfloat16) if {"amx_bf16", "amx_tile"} <= cpu_flags() else None
    if bf16 is None:
        return None
    bf16.lib.gemm_bf16_amx_permitted.restype = ctypes.c_int
    return NativeGemm(bf16.lib, torch.bfloat16, "gemm_bf16_amx") if bf16.lib.gemm_bf16_amx_permitted() else None
