"""Varlen paged attention in one launch: decode, prefill chunks and mixed batches.

Same contract as `pageserve_kernels.reference.paged_attention_ref` (read its docstring for
the cache layout and the flat batch). This file owns the Triton kernel and its
launcher; it knows nothing about models, schedulers or block allocation.

Work split. A program handles one *query block* of one request and one KV head:

    rows of the M tile = (query token, query head of this KV group)

        row r -> query token  q_block * BLOCK_Q + r // GROUP
                 query head   kv_head * GROUP  + r %  GROUP

so every K/V tile loaded from the cache serves all GROUP query heads that share
it (grouped-query attention of any ratio; rows past BLOCK_Q * GROUP are padding).
The program walks the request's KV positions TILE_N tokens at a time, gathering
each token's physical block from the block table (a tile may span several cache
blocks), with an online softmax in float32.

Split-K. A decode batch of a few long requests has few (request, KV head) pairs,
too few programs to fill a GPU; a third grid axis cuts the KV range into
num_splits contiguous parts (a runtime value: a new split count never compiles
a new binary; only SPLIT_K, whether there is more than one, is a constexpr). Each part writes its normalised partial output and
log-sum-exp (base 2) to a float32 scratch, and `merge_splits` reduces them.

Query blocks to programs. Request b's query blocks start at program
query_start_loc[b] // BLOCK_Q + b: at least cdiv(q_len_b, BLOCK_Q) slots apart,
so grid axis 0 has T // BLOCK_Q + B programs; each finds its request by binary
search and spare ones exit at once. When every request fits one query block
(decode, short chunks) the launcher uses one program per request instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.attention_launch import (
    ATTENTION_DO_NOT_SPECIALIZE,
    attention_constexprs,
    attention_int_args,
    plan_launch,
)
from pageserve_kernels.bf16 import store_cast
from pageserve_kernels.checks import KernelArgError, check_paged_attention_args, upcast_dots
from pageserve_kernels.merge_splits import merge_splits

LOG2E = 1.4426950408889634


@triton.jit
def _find_request(query_start_loc_ptr, num_seqs, q_block_global, BLOCK_Q: tl.constexpr):
    """The last request b whose first query-block slot is <= q_block_global."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a @ b accumulated in float32; float32 operands stay exact (no TF32 rounding)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend_tiles(
    q,  # (BLOCK_M, HEAD_DIM_P) queries of one KV group
    q_pos,  # (BLOCK_M,) absolute position of each row's query
    table,  # this request's block-table row
    k_head_ptr,  # key cache, offset to this KV head
    v_head_ptr,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    kv_len,  # keys at positions >= kv_len are never read
    kv_lo,  # with WINDOWED, nor those < kv_lo (before the first row's window), though a tile may hold some
    tile_lo,
    tile_hi,
    qk_scale,
    window,  # with WINDOWED, a row at position p sees keys p - window + 1 .. p
    softcap,  # with SOFTCAPPED, natural-log scores x become softcap * tanh(x / softcap)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAPPED: tl.constexpr,
):
    """Online softmax over key tiles [tile_lo, tile_hi): (unnormalised acc, row sums, row maxima)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], tl.float32)
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    offs_n = tl.arange(0, TILE_N)
    for tile in range(tile_lo, tile_hi):
        pos = tile * TILE_N + offs_n  # (TILE_N,) key positions; a tile may span several blocks
        pos_ok = pos < kv_len
        if WINDOWED:
            pos_ok = pos_ok & (pos >= kv_lo)
        block = tl.load(table + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        in_block = pos % BLOCK_SIZE
        k_off = block * stride_kb + in_block * stride_ks  # (TILE_N,)
        v_off = block * stride_vb + in_block * stride_vs
        k_mask = d_ok[:, None] & pos_ok[None, :]
        v_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_head_ptr + k_off[None, :] + d[:, None], mask=k_mask, other=0.0)  # (HEAD_DIM_P, TILE_N)
        v = tl.load(v_head_ptr + v_off[:, None] + d[None, :], mask=v_mask, other=0.0)  # (TILE_N, HEAD_DIM_P)

        s = _dot(q, k, UPCAST) * qk_scale  # (BLOCK_M, TILE_N), base-2 logits
        if SOFTCAPPED:  # s = x * log2(e): softcap * tanh(x / softcap) * log2(e), tanh(y) = 1 - 2 / (e^2y + 1)
            s = (softcap * 1.4426950408889634) * (1.0 - 2.0 / (tl.math.exp2(s * (2.0 / softcap)) + 1.0))
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; shift it by 0, not by -inf.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(store_cast(p, v.dtype, UPCAST), v, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _load_queries(
    q_ptr,
    q_start,  # the request's first query token
    q_len,
    ctx_len,  # tokens cached before this step's queries
    q_block,
    kv_head,
    stride_qt,
    stride_qh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """The query block's rows (BLOCK_Q tokens x the KV head's GROUP query heads): (q, token, head, valid, position)."""
    rows = tl.arange(0, BLOCK_M)
    q_idx = q_block * BLOCK_Q + rows // GROUP  # (BLOCK_M,) query token within the request
    head = kv_head * GROUP + rows % GROUP  # (BLOCK_M,) query head
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    d = tl.arange(0, HEAD_DIM_P)
    q_rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & (d < HEAD_DIM)[None, :],
        other=0.0,
    )  # (BLOCK_M, HEAD_DIM_P)
    return q, q_rows, head, row_ok, ctx_len + q_idx


@triton.jit(do_not_specialize=ATTENTION_DO_NOT_SPECIALIZE)
def _paged_attention_kernel(
    out_ptr,  # (T, n_q, hd), written when not SPLIT_K
    part_out_ptr,  # (T, n_q, num_splits, HEAD_DIM) float32, written when SPLIT_K
    part_lse_ptr,  # (T, n_q, num_splits) float32, log2-sum-exp2 of each part
    q_ptr,  # (T, n_q, hd)
    k_cache_ptr,  # (num_blocks, block_size, n_kv, hd)
    v_cache_ptr,
    block_tables_ptr,  # (B, max_blocks)
    query_start_loc_ptr,  # (B + 1,)
    seq_lens_ptr,  # (B,)
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    window,  # > 0 with WINDOWED: each query sees its last `window` keys
    softcap,  # > 0 with SOFTCAPPED: scores capped before the mask (reference.py)
    num_seqs,
    num_splits,  # runtime: any value in [1, MAX_SPLITS] uses the same binary
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    n_q_heads,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT_K: tl.constexpr,  # num_splits > 1: write partial results for merge_splits
    ONE_Q_BLOCK: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreting bf16: widen dot operands, round stores by hand
    WINDOWED: tl.constexpr,  # window > 0 (a plain layer's binary has no window compare)
    SOFTCAPPED: tl.constexpr,  # softcap > 0 (nor any tanh)
):
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if ONE_Q_BLOCK:
        seq = tl.program_id(0)
        q_block = 0
    else:
        seq = _find_request(query_start_loc_ptr, num_seqs, tl.program_id(0), BLOCK_Q)
        q_block = tl.program_id(0) - (tl.load(query_start_loc_ptr + seq) // BLOCK_Q + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + seq) - q_len  # tokens cached before this step's queries

    q, q_rows, head, row_ok, q_pos = _load_queries(
        q_ptr, q_start, q_len, ctx_len, q_block, kv_head, stride_qt, stride_qh,
        HEAD_DIM, HEAD_DIM_P, GROUP, BLOCK_M, BLOCK_Q,
    )  # fmt: skip

    # Causality bounds the keys this query block can see, and a window the first of them (tiles wholly
    # before the block's first query's window are never read); the split takes its share.
    kv_len = ctx_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    n_tiles = tl.cdiv(kv_len, TILE_N)
    kv_lo = 0
    if WINDOWED:
        kv_lo = tl.maximum(ctx_len + q_block * BLOCK_Q - window + 1, 0)
    first_tile = kv_lo // TILE_N
    tiles_per_split = tl.cdiv(n_tiles - first_tile, num_splits)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, n_tiles)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = _attend_tiles(
        q, q_pos, table, k_cache_ptr + kv_head * stride_kh, v_cache_ptr + kv_head * stride_vh,
        stride_kb, stride_ks, stride_vb, stride_vs, kv_len, kv_lo, tile_lo, tile_hi, qk_scale, window, softcap,
        HEAD_DIM, HEAD_DIM_P, BLOCK_M, BLOCK_SIZE, TILE_N, UPCAST, WINDOWED, SOFTCAPPED,
    )  # fmt: skip

    _store_rows(
        out_ptr, part_out_ptr, part_lse_ptr, acc, l_i, m_i, q_rows, head, row_ok, split, num_splits, n_q_heads,
        stride_ot, stride_oh, HEAD_DIM, HEAD_DIM_P, SPLIT_K, UPCAST,
    )  # fmt: skip


@triton.jit
def _store_rows(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    acc,  # (BLOCK_M, HEAD_DIM_P) unnormalised outputs
    l_i,  # (BLOCK_M,) row sums of exp2
    m_i,  # (BLOCK_M,) row maxima (base 2)
    q_rows,  # (BLOCK_M,) query token of each row
    head,  # (BLOCK_M,) query head of each row
    row_ok,
    split,
    num_splits,
    n_q_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The rows' outputs; with SPLIT_K, this split's partial outputs and log2-sum-exp2 for merge_splits."""
    d = tl.arange(0, HEAD_DIM_P)
    mask = row_ok[:, None] & (d < HEAD_DIM)[None, :]
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    res = acc / l_safe[:, None]
    if not SPLIT_K:
        o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, store_cast(res, out_ptr.dtype.element_ty, UPCAST), mask=mask)
    else:
        part_row = (q_rows * n_q_heads + head) * num_splits + split  # (BLOCK_M,)
        tl.store(part_out_ptr + part_row[:, None] * HEAD_DIM + d[None, :], res, mask=mask)
        lse = tl.where(l_i > 0.0, m_i + tl.math.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)


def paged_attention(
    query: torch.Tensor,  # (T, n_q, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    query_start_loc: torch.Tensor,  # (B + 1,) int32
    seq_lens: torch.Tensor,  # (B,) int32
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # (T, n_q, hd)
    """Attention of every query token over its request's cached keys, causally (`window`, `softcap`: reference.py).

    Pass max_query_len and max_seq_len when the caller knows them (the runner does): otherwise they are
    read from the device tensors, a host sync. num_splits, tile_n, num_warps and num_stages override the
    heuristics (tests, and tuning with ops/bench/kernels/attention.py on a GPU).
    """
    check_paged_attention_args(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, window,
                               softcap)
    num_tokens, n_q, head_dim = query.shape
    block_size, n_kv, batch = key_cache.shape[1], key_cache.shape[2], block_tables.shape[0]
    if out is None:
        out = torch.empty_like(query)
    elif out.shape != query.shape or out.dtype != query.dtype or out.stride(-1) != 1:
        raise KernelArgError("out", f"{tuple(out.shape)} {out.dtype} does not match query")
    if num_tokens == 0 or batch == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    plan = plan_launch(
        num_tokens, batch, n_q, n_kv, head_dim, max_query_len, max_seq_len, query.device,
        num_splits=num_splits, tile_n=tile_n, num_warps=num_warps,
    )  # fmt: skip
    num_splits = plan.num_splits
    part_out = part_lse = out  # placeholders the kernel never touches without SPLIT_K
    if num_splits > 1:
        part_out = torch.empty(num_tokens, n_q, num_splits, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(num_tokens, n_q, num_splits, dtype=torch.float32, device=query.device)
    consts = attention_constexprs(plan, n_q, n_kv, head_dim, block_size, upcast_dots(query.dtype),
                                  windowed=window > 0, softcapped=softcap > 0)
    ints = attention_int_args(query, out, key_cache, value_cache, block_tables, num_splits)
    _paged_attention_kernel[(plan.grid0, n_kv, num_splits)](
        out, part_out, part_lse, query, key_cache, value_cache,
        block_tables, query_start_loc, seq_lens, scale * LOG2E, window, float(softcap),
        **ints, **consts, num_warps=plan.num_warps, num_stages=num_stages,
    )  # fmt: skip
    if num_splits > 1:
        merge_splits(part_out, part_lse, out)
    return out
