"""LoRA's products on the CPU, in C: every adapter group of a step, one projection per call, float32 (AVX2 +
FMA) and bfloat16 (AVX512-BF16 dot products, float32 sums). Punica's split, per group g of rows:

    shrink  s = x[rows_g] A_g^T               (n_g, R)   A_g: every targeted slice's lora_A, stacked
    expand  out[rows_g, slice] += s[:, r0:r1] B^T        one per targeted slice of the fused projection

Layouts, chosen for rank-16 adapters next to 576-8192 wide projections:
  - A is prepacked once, at adapter load, in blocks of 4 of its rows, (ceil(R/4), ceil(K/w), 4, w) with w
    one vector of k (8 float32, 32 bfloat16), zero padded: each s element is one vector dot over k (a tile
    is 4 x rows x one block), and a block is one stream of memory, not four rows read side by side (14-20%
    faster a call than reading A as stored, cold, Zen 4). Panels of 16 or 32 output columns, as the base
    GEMM's, would pad a rank-16 (or rank-8) A to twice its bytes, and A is most of what the shrink reads.
  - B of each slice is prepacked once, at adapter load, into cpu_gemm.py's panels (float32
    (ceil(n/16), r, 16); bfloat16 (ceil(n/32), ceil(r/2), 32, 2)): an expand is a small GEMM with K = r
    that adds into the rows' output columns. Each slice has its own panels (no zero blocks between a
    fused projection's slices), so the bytes read are the adapter's own.

One call does every group of the step for one projection of one layer in one OpenMP region (the shrink's
(group, 4 columns of s) items, a barrier, the expand's (group, slice, panel) items), so a step costs one
call per projection and layer, not per adapter. The groups come as an entry table (csrc/lora_entry.h):
per (group, layer, projection) ENTRY int64s naming the group's rows, packed A's address and rank, and each
slice's columns and B panels' address. An adapter's table (its entries without rows) is built at load
(engine/worker/lora/adapter.py) and holds addresses of tensors the adapter keeps; a step stacks its
groups' tables and writes their row ranges (engine/worker/lora/batch.py). Rows are any list of the
step's rows: a contiguous group is its range, the others their indices.

At load, lora_pack.py (csrc/lora_pack.c) writes both layouts in one single-threaded C call straight from
the adapter file's bytes; `pack_a` and `pack_b` below are the PyTorch definition of those layouts, which
that C is tested against bit for bit, and the path where it does not load.

Every element's sums run in an order fixed by K, r and the layouts alone: a row's LoRA term does not
depend on which rows share its step. The Python layers (engine/worker/lora/batch.py) and the C++ layer
loop (csrc/llama_layers.cpp) call the same function on the same bytes, so both paths agree bit for bit;
PyTorch's products in batch.py are the reference these kernels are tested against and the fallback
where they do not load (no AVX2/FMA, no AVX512-BF16, no C compiler, PAGESERVE_NATIVE_KERNELS=0).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from pageserve_kernels import native_build
from pageserve_kernels.cpu_features import cpu_flags
from pageserve_kernels.cpu_gemm import pack_panels

PROJECTIONS = ("qkv", "o", "gate_up", "down")
"""The fused projections, in the order of an adapter table's second axis."""
MAX_SLICES = 4
ENTRY = 5 + 5 * MAX_SLICES
"""int64s per (group, layer, projection): csrc/lora_entry.h's fields."""
_KERNELS = {torch.float32: "lora_f32", torch.bfloat16: "lora_bf16"}
A_BLOCK = {torch.float32: 8, torch.bfloat16: 32}
"""k per row of a packed A's block: one vector of the dtype."""
_FLAGS = {torch.float32: {"avx2", "fma"}, torch.bfloat16: {"avx512f", "avx512bw", "avx512_bf16"}}

Slice = tuple[int, int, int, int, torch.Tensor]
"""(first output column, end column, first column of s, end column of s, B's panels)."""


def pack_b(b: torch.Tensor) -> torch.Tensor:
    """One slice's B (n, r) in the panels its dtype's expand reads (cpu_gemm.py's layout)."""
    return pack_panels(b.contiguous()).panels


def pack_a(a: torch.Tensor) -> torch.Tensor:
    """A (R, K) in the shrink's blocks of 4 rows: (ceil(R/4), ceil(K/w), 4, w), zero padded (A_BLOCK's w)."""
    r, k = a.shape
    w = A_BLOCK[a.dtype]
    padded = torch.zeros(-(-r // 4) * 4, -(-k // w) * w, dtype=a.dtype)
    padded[:r, :k] = a
    return padded.view(padded.shape[0] // 4, 4, padded.shape[1] // w, w).permute(0, 2, 1, 3).contiguous()


def entry(a_packed: torch.Tensor, rank: int, slices: Sequence[Slice]) -> list[int]:
    """An adapter's entry for one projection, its rows left 0: A packed (pack_a) of `rank` rows, each slice's
    panels. The caller keeps them alive as long as the entry may be used."""
    assert a_packed.is_contiguous() and a_packed.dim() == 4 and len(slices) <= MAX_SLICES
    fields = [0, 0, a_packed.data_ptr(), rank, len(slices)]
    for start, end, r0, r1, panels in slices:
        assert panels.is_contiguous() and panels.dtype == a_packed.dtype and 0 <= r0 < r1 <= rank
        fields += [start, end, r0, r1, panels.data_ptr()]
    return fields + [0] * (ENTRY - len(fields))


class NativeLora:
    """ctypes binding of one dtype's compiled kernel."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self.dtype, self.lib = dtype, lib
        self._fn = getattr(lib, _KERNELS[dtype])
        self._fn.restype, self._fn.argtypes = None, [p, i, p, i, i, p, p, i, i, ctypes.c_int]

    def address(self) -> int:
        """The C function, for pageserve_kernels/csrc/llama_layers.cpp (both dtypes' share a signature)."""
        return native_build.address(self._fn)

    def add(self, out: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, layer: int,
            projection: int) -> None:
        """out (T, N) += every group's LoRA term of x (T, K) for `projection` of `layer`, in place.
        table (G, L, len(PROJECTIONS), ENTRY) int64 with each group's row range into rows (n,) int64."""
        assert x.dtype == out.dtype == self.dtype and x.dim() == out.dim() == 2 and x.shape[0] == out.shape[0]
        assert out.stride(1) == 1 and rows.dtype == table.dtype == torch.int64 and rows.is_contiguous()
        assert table.is_contiguous() and table.shape[1:] == (table.shape[1], len(PROJECTIONS), ENTRY)
        assert 0 <= layer < table.shape[1] and 0 <= projection < len(PROJECTIONS)
        if x.stride(1) != 1:
            x = x.contiguous()
        entries = table.data_ptr() + (layer * len(PROJECTIONS) + projection) * ENTRY * table.element_size()
        self._fn(x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), x.shape[1], rows.data_ptr(), entries,
                 table.shape[0], table.stride(0), torch.get_num_threads())


@functools.cache
def load(dtype: torch.dtype) -> NativeLora | None:
    """The compiled kernel for `dtype`, or None: another dtype, the CPU lacks its instructions (AVX2 + FMA;
    AVX-512 BW and BF16), disabled, or no C compiler works."""
    if dtype not in _KERNELS or not _FLAGS[dtype] <= cpu_flags():
        return None
    lib = native_build.try_load_kernel(_KERNELS[dtype], native_build.EXACT_FLAGS)
    return None if lib is None else NativeLora(lib, dtype)
