"""Merge the split-K partial results of paged attention into the final output.

Each of the NUM_SPLITS parts of a (token, head) row holds its softmax-normalised
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


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # (T, n_q, hd)
    part_out_ptr,  # (T, n_q, NUM_SPLITS, HEAD_DIM) float32, contiguous
    part_lse_ptr,  # (T, n_q, NUM_SPLITS) float32, contiguous
    stride_ot,
    stride_oh,
    n_q_heads,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * n_q_heads + head
    s = tl.arange(0, SPLITS_P)
    s_ok = s < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s_ok, other=float("-inf"))  # (SPLITS_P,)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m)  # 0 for empty and padding parts
    parts = tl.load(
        part_out_ptr + (row * NUM_SPLITS + s)[:, None] * HEAD_DIM + d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # (SPLITS_P, HEAD_DIM_P)
    denom = tl.sum(w, 0)
    res = tl.sum(parts * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + d,
        store_cast(res, out_ptr.dtype.element_ty, EXACT_BF16),
        mask=d_ok,
    )


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
        out, part_out, part_lse, out.stride(0), out.stride(1), n_q,
        HEAD_DIM=head_dim, HEAD_DIM_P=max(16, next_pow2(head_dim)),
        NUM_SPLITS=num_splits, SPLITS_P=max(2, next_pow2(num_splits)),
        EXACT_BF16=exact_bf16(out.dtype),
    )  # fmt: skip
    return out
