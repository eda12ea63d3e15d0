"""Decode attention over the paged KV cache in C: one pass over the K/V bytes, no gather.

Part of the CPU attention path (pageserve_kernels/cpu_attention.py uses it for decode rows).
A decode query attends to every token of its request, and at serving batch
sizes that read is the step's memory traffic: PyTorch alone must gather the
blocks into a padded copy first (read, write, read again). This kernel walks
each request's block table and reads K and V in place, float32 and bfloat16.

    for each request b (OpenMP task; split by KV head only when requests are too few
    to keep every thread busy), block by block, every KV head h of the block:
        scores[g, s] = q[h*grp + g] . K[table[s // bs], s % bs, h] * scale
    p = softmax(scores[g, :seq_len])            (max-subtracted, in float32)
    out[g] = sum_s p[g, s] * V[table[s // bs], s % bs, h]

Reading a block's heads together streams one contiguous run per block. With
AVX2+FMA the dot products take eight tokens at a time (eight independent FMA
chains, one horizontal-sum shuffle for all eight), the weighted sum keeps 64
output columns in registers across a block, and exp is vectorised; other CPUs
and head sizes not a multiple of 8 take the scalar loops, which are the spec.
Memory-bound once contexts leave the caches: ~2x the previous one-token-at-a-time loop.

The source (pageserve_kernels/csrc/paged_decode.c) is compiled on first use (pageserve_kernels/native_build.py); without a
compiler, or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and callers
keep the pure-PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pageserve_kernels import native_build

SUPPORTED = (torch.float32, torch.bfloat16)



class NativeDecode:
    """ctypes bindings of the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        argtypes = [p, p, p, p, p, p, i, p, i, i, i, i, i, ctypes.c_float, i, ctypes.c_int, i]
        self._fns = {}
        for dtype, name in ((torch.float32, "paged_decode_f32"), (torch.bfloat16, "paged_decode_bf16")):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, argtypes
            self._fns[dtype] = fn

    def __call__(
        self,
        out: torch.Tensor,  # (T, n_q, hd) contiguous; rows `rows` are written
        query: torch.Tensor,  # (T, n_q, hd), heads contiguous (rows may be strided: a slice of q|k)
        key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd) contiguous
        value_cache: torch.Tensor,
        rows: torch.Tensor,  # (D,) int64: the decode rows
        block_tables: torch.Tensor,  # (D, max_blocks) int64 contiguous
        seq_lens: torch.Tensor,  # (D,) int64
        max_seq_len: int,
        scale: float,
    ) -> None:
        n_q, hd = query.shape[1], query.shape[2]
        bs, n_kv = key_cache.shape[1], key_cache.shape[2]
        assert query.dtype == key_cache.dtype == value_cache.dtype == out.dtype and query.dtype in SUPPORTED
        assert query.stride(2) == 1 and query.stride(1) == hd
        assert out.is_contiguous() and key_cache.is_contiguous()
        assert value_cache.is_contiguous() and block_tables.is_contiguous()
        assert n_q % n_kv == 0
        self._fns[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), out.data_ptr(), rows.data_ptr(),
            block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(), rows.shape[0], n_q, n_kv, hd, bs,
            scale, max_seq_len, torch.get_num_threads(), query.stride(0),
        )


@functools.cache
def load() -> NativeDecode | None:
    """The compiled kernel, or None when disabled or no C compiler works here."""
    lib = native_build.try_load_kernel("paged_decode")
    return None if lib is None else NativeDecode(lib)
