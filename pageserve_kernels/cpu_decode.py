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

Reading a block's heads together streams one contiguous run per block. The loops come in
variants (`VARIANTS`), each compiled in where the host has its instructions:
  scalar       plain C: the specification the others are tested against
  avx2         eight tokens at a time (eight FMA chains, one horizontal-sum shuffle for all
               eight), 64 output columns in registers across a block, vectorised exp
  avx512       sixteen tokens at a time (sixteen FMA chains) and one reduction tree for
               their sixteen scores; bfloat16 K widened by a shift and an and, each V row
               widened once for the whole GQA group (head sizes that are multiples of 32); and
               the leading blocks that a group of requests shares (a system prompt the prefix
               cache keeps once; requests sorted by their block tables, 12 or more a group) as
               tiles of up to 16 requests' rows (csrc/shared_prefix.h: keys transposed once per
               tile, an online softmax whose state each request's own blocks then continue)
  avx512_bf16  as avx512, the bfloat16 scores by AVX512-BF16's dot-product instruction
The K pass's prefetches run on into the V pass's first blocks.

A layer with a sliding window (`window` > 0) starts each request at the block holding its first key inside
the window and never reads the blocks before it (that is the point: a long context costs a windowed layer
only its window); the keys of that first block before the window get probability 0. A soft-capped layer
(`softcap` > 0, Gemma 2) caps the scores (csrc/softcap.h) before the softmax, including in the shared-prefix
tiles; a windowed call plans no shared-prefix tiles (the window skips a long request's leading blocks).
Both are tested once per task, so a plain layer's loops are unchanged.
The variant is chosen once per dtype and shape by timing the ones that apply
(pageserve_kernels/choice.py: cached per host; PAGESERVE_KERNEL_CHOICE=decode_attention=avx2
forces one).

The source (pageserve_kernels/csrc/paged_decode.c) is compiled on first use (pageserve_kernels/native_build.py); without a
compiler, or with PAGESERVE_NATIVE_KERNELS=0, `load()` returns None and callers
keep the pure-PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from pageserve_kernels import choice, native_build

SUPPORTED = (torch.float32, torch.bfloat16)
VARIANTS = ("scalar", "avx2", "avx512", "avx512_bf16")  # the C enum's order
TIMING_REQUESTS, TIMING_CONTEXT = 32, 384  # the batch the variants are timed on (a busy serving step)



class NativeDecode:
    """ctypes bindings of the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        argtypes = [p, p, p, p, p, p, i, p, i, i, i, i, i, ctypes.c_float, i, ctypes.c_int, i, ctypes.c_int, i,
                    ctypes.c_float]
        self._fns = {}
        for dtype, name in ((torch.float32, "paged_decode_f32"), (torch.bfloat16, "paged_decode_bf16")):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, argtypes
            self._fns[dtype] = fn
        lib.paged_decode_sharing.restype, lib.paged_decode_sharing.argtypes = i, [p, i, p, i, i, p]
        self._sharing = lib.paged_decode_sharing
        lib.paged_decode_isas.restype, lib.paged_decode_isas.argtypes = ctypes.c_int, []
        built = lib.paged_decode_isas()
        self.variants = tuple(v for i, v in enumerate(VARIANTS) if built >> i & 1)
        """The variants this build has (all of them run on this host)."""
        self._picks: dict[tuple[object, ...], int] = {}

    def address(self, dtype: torch.dtype) -> int:
        """The C function for `dtype`, for pageserve_kernels/csrc/llama_layers.cpp."""
        return native_build.address(self._fns[dtype])

    def applicable(self, dtype: torch.dtype, head_dim: int) -> tuple[str, ...]:
        """The built variants that run as themselves for this dtype and head size (others fall back)."""
        wide_ok = head_dim % 32 == 0
        return tuple(v for v in self.variants
                     if not (v.startswith("avx512") and not wide_ok) and not (v == "avx512_bf16" and dtype != torch.bfloat16))

    def shared_blocks(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> list[int] | None:
        """The blocks each request reads in tiles shared with others (the AVX-512 variants' plan for a batch
        whose requests begin with the same blocks); None where this build has no such variant."""
        tables, lens = block_tables.to(torch.int64).contiguous(), seq_lens.to(torch.int64).contiguous()
        first = torch.zeros(lens.shape[0], dtype=torch.int64)
        tiles = self._sharing(tables.data_ptr(), tables.shape[1], lens.data_ptr(), lens.shape[0], block_size,
                              first.data_ptr())
        return None if tiles < 0 else first.tolist()

    def candidates(self, dtype: torch.dtype, head_dim: int) -> tuple[str, ...]:
        """What `pick` times: the applicable vector variants (a timing on a busy host once put the
        scalar loops first, at half their speed); the scalar loops where none applies, or when forced."""
        names = self.applicable(dtype, head_dim)
        vector = tuple(v for v in names if v != "scalar")
        return names if not vector or choice.forced("decode_attention") == "scalar" else vector

    def pick(self, dtype: torch.dtype, n_q: int, n_kv: int, head_dim: int, block_size: int) -> str:
        """The fastest applicable variant for this shape on this host (timed once, cached on disk)."""
        key = (dtype, n_q, n_kv, head_dim, block_size)
        if key not in self._picks:
            names = self.candidates(dtype, head_dim)
            made = choice.choose(
                "decode_attention",
                f"{str(dtype).removeprefix('torch.')} n_q={n_q} n_kv={n_kv} hd={head_dim} block={block_size}",
                names, lambda: _timers(self, names, dtype, n_q, n_kv, head_dim, block_size))
            self._picks[key] = VARIANTS.index(made.pick)
        return VARIANTS[self._picks[key]]

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
        variant: str | None = None,  # None: the picked one
        window: int = 0,  # > 0: each row sees its last `window` keys, read from the first block holding one
        softcap: float = 0.0,  # > 0: scores capped to softcap * tanh(score / softcap) (reference.py)
    ) -> None:
        n_q, hd = query.shape[1], query.shape[2]
        bs, n_kv = key_cache.shape[1], key_cache.shape[2]
        if variant is None:
            pick = self._picks.get((query.dtype, n_q, n_kv, hd, bs))
            isa = VARIANTS.index(self.pick(query.dtype, n_q, n_kv, hd, bs)) if pick is None else pick
        else:
            isa = VARIANTS.index(variant)
        assert query.dtype == key_cache.dtype == value_cache.dtype == out.dtype and query.dtype in SUPPORTED
        assert query.stride(2) == 1 and query.stride(1) == hd
        assert out.is_contiguous() and key_cache.is_contiguous()
        assert value_cache.is_contiguous() and block_tables.is_contiguous()
        assert n_q % n_kv == 0
        self._fns[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), out.data_ptr(), rows.data_ptr(),
            block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(), rows.shape[0], n_q, n_kv, hd, bs,
            scale, max_seq_len, torch.get_num_threads(), query.stride(0), isa, window, softcap,
        )


def _timers(kernel: NativeDecode, names: tuple[str, ...], dtype: torch.dtype, n_q: int, n_kv: int, head_dim: int,
            block_size: int) -> dict[str, Callable[[], object]]:
    """Each variant on a decode batch of TIMING_REQUESTS requests of TIMING_CONTEXT tokens."""
    blocks = -(-TIMING_CONTEXT // block_size)
    num_blocks = TIMING_REQUESTS * blocks
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen).to(dtype)
    query = torch.randn(TIMING_REQUESTS, n_q, head_dim, generator=gen).to(dtype)
    out = torch.empty_like(query)
    rows = torch.arange(TIMING_REQUESTS)
    tables = torch.randperm(num_blocks, generator=gen).view(TIMING_REQUESTS, blocks)
    lens = torch.full((TIMING_REQUESTS,), TIMING_CONTEXT, dtype=torch.int64)

    def run(name: str) -> Callable[[], object]:
        return lambda: kernel(out, query, kc, vc, rows, tables, lens, TIMING_CONTEXT, head_dim**-0.5, name)

    return {name: run(name) for name in names}


@functools.cache
def load() -> NativeDecode | None:
    """The compiled kernel, or None when disabled or no C compiler works here."""
    lib = native_build.try_load_kernel("paged_decode")
    return None if lib is None else NativeDecode(lib)
