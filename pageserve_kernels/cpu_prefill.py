"""Causal attention of prompt chunks over the paged KV cache in C (float32 or bfloat16, AVX2 + FMA).

Part of the CPU attention path (pageserve_kernels/cpu_attention.py hands it every prompt
chunk of a step when it is available). PyTorch's CPU flash attention runs at
~30-35 GFLOP/s on SmolLM2's prompt shapes, and a chunk that continues a prompt
must first gather its context out of the cache; this kernel reads the blocks in
place through the block table, 16 keys at a time:

    one OpenMP task per (chunk, KV head, tile of TILE_TOKENS query tokens), longest first:
      rows = the tile's tokens x the head's grp query heads, scaled by `scale`
      for each block holding keys the tile may see (position <= the query's):
        S = rows . K_block^T            6x16 FMA tiles over a transposed copy of the block
        causal mask, online softmax     running max and sums per row, moved only when a block's
                                        scores rise more than 8 above the max (one vector compare
                                        a block otherwise; a block's 16 scores are one AVX-512 vector)
        O += P . V_block                6x64 AVX-512 tiles (6x16 with AVX2) over a widened copy of V
      out = O / sum

Query token t of a chunk sits at position context_len + t and sees keys 0 ..
context_len + t (its own K/V is already in the cache: the engine writes a step's
K/V before attending); with a sliding window (`window` > 0) only its last `window` of them: a tile's
key loop starts at its first query's first key, and each row masks the keys before its own (a lower
lane bound in online_softmax). `softcap` > 0 caps each block's scores (csrc/softcap.h) before the mask.
A plain layer's tiles are compiled with both at 0 (one branch a task). Results equal softmax(q K^T * scale) V up to float32
rounding (summation order differs from PyTorch's). bfloat16 tensors are widened to
float32 as the tiles are copied (the copy happens for float32 too), everything runs in
float32 and each output is rounded to bfloat16 once: on an AMD EPYC with AVX512-BF16,
PyTorch's bfloat16 attention took 626 ms of a 2,048-token prompt step where this kernel
takes about as long as its float32 run (~290 ms). Where the build has AVX512-BF16, a bfloat16
tile's S = Q . K^T instead comes from the tensors' own bfloat16 pairs by `_mm512_dpbf16_ps`
(exact products summed in float32; `NativePrefill.dot_products`), P . V as above. Where it has AMX,
both products run on tiles (csrc/prefill_amx.h): S from the same pairs, and O += P . V with P in two
bfloat16 parts (hi + lo, within ~2^-16 of the float32 P), the softmax between them unchanged.

pageserve_kernels/csrc/prefill_attention.c, compiled on first use (pageserve_kernels/native_build.py); without AVX2+FMA, a compiler,
or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and chunks keep
PyTorch's scaled_dot_product_attention.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pageserve_kernels import native_build
from pageserve_kernels.cpu_features import has_avx2_fma

TILE_TOKENS = 32  # query tokens per task (mirrors the C define)
# Each task copies every key it may see into float32 scratch once, so the copy is paid per tile:
# 32 tokens (96 query rows for SmolLM2's 3 heads per KV head) halve it against 16. AMD EPYC with
# AVX512-BF16, bench offline --workload chat --dtype bfloat16 --profile: prompt attention 5.46 -> 4.70 s.



class NativePrefill:
    """ctypes binding of the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fns = {torch.float32: lib.prefill_attention_f32, torch.bfloat16: lib.prefill_attention_bf16}
        args = [p, i, p, p, p, p, p, p, p, i, i, i, i, i, i, ctypes.c_float, ctypes.c_int, i, ctypes.c_float]
        for dtype, fn in self._fns.items():  # the bfloat16 entry takes one more: dot_products
            fn.restype, fn.argtypes = None, args + ([ctypes.c_int] if dtype == torch.bfloat16 else [])
        lib.prefill_attention_has_amx.restype = ctypes.c_int
        self.has_dot_products = bool(lib.prefill_attention_has_dpbf16())
        """bfloat16 Q . K^T by AVX512-BF16 dot products is compiled in (the host has the instructions)."""
        self.has_amx = bool(lib.prefill_attention_has_amx())
        """Both bfloat16 products on AMX tiles are compiled in and Linux granted the process their state."""
        self.dot_products = 2 if self.has_amx else int(self.has_dot_products)
        """bfloat16 products: 2 AMX tiles, 1 AVX512-BF16 dot products for Q . K^T, 0 keys widened to float32
        (the best this build has; tests set the others to check every path the host runs)."""

    def address(self, dtype: torch.dtype) -> int:
        """The C function for `dtype`, for pageserve_kernels/csrc/llama_layers.cpp."""
        return native_build.address(self._fns[dtype])

    def __call__(
        self,
        out: torch.Tensor,  # (T, n_q, hd) contiguous; the chunks' rows are written
        query: torch.Tensor,  # (T, n_q, hd), heads contiguous (rows may be strided: a slice of q|k)
        key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd) contiguous, holding the chunks' K/V
        value_cache: torch.Tensor,
        starts: torch.Tensor,  # (C,) int64 first row of each chunk
        lens: torch.Tensor,  # (C,) int64 query tokens of each chunk
        context_lens: torch.Tensor,  # (C,) int64 tokens cached before each chunk
        block_tables: torch.Tensor,  # (C, max_blocks) int64 contiguous
        scale: float,
        window: int = 0,  # > 0: a query at position p sees keys p - window + 1 .. p (tiles before never read)
        softcap: float = 0.0,  # > 0: scores capped to softcap * tanh(score / softcap) (reference.py)
    ) -> None:
        n_q, hd = query.shape[1], query.shape[2]
        bs, n_kv = key_cache.shape[1], key_cache.shape[2]
        assert supports(query.dtype, hd) and key_cache.dtype == value_cache.dtype == out.dtype == query.dtype
        assert query.stride(2) == 1 and query.stride(1) == hd and n_q % n_kv == 0
        assert out.is_contiguous() and key_cache.is_contiguous() and value_cache.is_contiguous()
        assert block_tables.is_contiguous() and block_tables.dtype == torch.int64
        self._fns[query.dtype](query.data_ptr(), query.stride(0), key_cache.data_ptr(), value_cache.data_ptr(), out.data_ptr(),
                 starts.data_ptr(), lens.data_ptr(), context_lens.data_ptr(), block_tables.data_ptr(),
                 block_tables.shape[1], starts.shape[0], n_q, n_kv, hd, bs, scale, torch.get_num_threads(),
                 window, softcap, *((int(self.dot_products),) if query.dtype == torch.bfloat16 else ()))


def supports(dtype: torch.dtype, head_dim: int) -> bool:
    """float32 or bfloat16, and a head size that is a multiple of 16 (the products' column tiles)."""
    return dtype in (torch.float32, torch.bfloat16) and head_dim % 16 == 0


@functools.cache
def load() -> NativePrefill | None:
    """The compiled kernel, or None without AVX2+FMA, when disabled, or where no C compiler works."""
    if not has_avx2_fma():
        return None
    lib = native_build.try_load_kernel("prefill_attention")
    return None if lib is None else NativePrefill(lib)
