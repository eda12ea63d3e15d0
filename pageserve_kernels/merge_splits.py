"""Merge the split-K partial results of paged attention into the final output.

Each of the num_splits parts of a (token, head) row holds its softmax-normalised
output o_s and the base-2 log-sum-exp of its scores lse_s (-inf for a part that
saw no visible key). The exact result is

    out = sum_s w_s * o_s / sum_s w_s,    w_s = 2 ** (lse_s - max_s lse_s)

This file knows nothing about caches or block tables: pageserve_kernels/paged_attention.py
produces the parts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.bf16 import store_cast
from pageserve_kernels.checks import KernelArgError, check_device, check_dim, exact_bf16, next_pow2

SPLIT_TILE = 16
"""Parts read per iteration; the split count itself is a runtime value (no binary per count)."""
MERGE_DO_NOT_SPECIALIZE = ("num_splits",)


@triton.jit(do_not_specialize=MERGE_DO_NOT_SPECIALIZE)
def _merge_splits_kernel(
    out_ptr,  # (T, n_q, hd)
    part_out_ptr,  # (T, n_q, num_splits, HEAD_DIM) float32, contiguous
    part_lse_ptr,  # (T, n_q, num_splits) float32, contiguous
    stride_ot,
    stride_oh,
    n_q_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    SPLIT_TILE: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * n_q_heads + head
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    s_tile = tl.arange(0, SPLIT_TILE)
    # Pass 1: the largest part log-sum-exp, so every weight below is <= 1.
    m = tl.full([], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, SPLIT_TILE):
        s = s0 + s_tile
        lse = tl.load(part_lse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    m = tl.where(m == float("-inf"), 0.0, m)
    # Pass 2: weighted sum of the parts.
    acc = tl.zeros([HEAD_DIM_P], tl.float32)
    denom = tl.full([], 0.0, tl.float32)
    for s0 in range(0, num_splits, SPLIT_TILE):
        s = s0 + s_tile
        s_ok = s < num_splits
        lse = tl.load(part_lse_ptr + row * num_splits + s, mask=s_ok, other=float("-inf"))
        w = tl.math.exp2(lse - m)  # 0 for empty and padding parts
        parts = tl.load(
            part_out_ptr + (row * num_splits + s)[:, None] * HEAD_DIM + d[None, :],
            mask=s_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # (SPLIT_TILE, HEAD_DIM_P)
        acc += tl.sum(parts * w[:, None], 0)
        denom += tl.sum(w, 0)
    res = acc / tl.where(denom > 0.0, denom, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + d,
        store_cast(res, out_ptr.dtype.element_ty, EXACT_BF16),
        mask=d_ok,
    )


def merge_constexprs(head_dim: int, exact: bool) -> dict[str, int | bool]:
    """merge_splits' compile-time constants: one binary per head size and dtype."""
    return {"HEAD_DIM": head_dim, "HEAD_DIM_P": max(16, next_pow2(head_dim)), "SPLIT_TILE": SPLIT_TILE,
            "EXACT_BF16": exact}


def merge_splits(
    part_out: torch.Tensor,  # (T, n_q, S, hd) float32
    part_lse: torch.Tensor,  # (T, n_q, S) float32
    out: torch.Tensor,  # (T, n_q, hd), written
) -> torch.Tensor:
    check_dim("part_out", part_out, 4)
    check_dim("part_lse", part_lse, 3)
    num_tokens, n_q, num_splits, head_dim = part_out.shape
    if part_lse.shape != (num_tokens, n_q, num_splits):
        raise KernelArgError("part_lse", f"shape {tuple(part_lse.shape)} does not match part_out")
    if out.shape != (num_tokens, n_q, head_dim) or out.stride(-1) != 1:
        raise KernelArgError("out", f"shape {tuple(out.shape)} strides {out.stride()} do not fit part_out")
    for name, t in (("part_out", part_out), ("part_lse", part_lse)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise KernelArgError(name, "must be contiguous float32")
    check_device("out", out)
    if num_tokens == 0:
        return out
    _merge_splits_kernel[(num_tokens, n_q)](
        out, part_out, part_lse, out.stride(0), out.stride(1), n_q, num_splits,
        **merge_constexprs(head_dim, exact_bf16(out.dtype)),
    )  # fmt: skip
    return out
