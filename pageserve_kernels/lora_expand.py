"""LoRA expand: add every group's shrunk rows times its slot's B into the fused output, in place, one launch.

Same contract as `lora_expand_ref` below (engine/worker/lora/batch.py's per-slice `out[rows, start:end] +=
s[:, r0:r1] B^T`). A fused projection's output has target slices; each slot lists its own (an adapter
of q and v only has two, one of the whole qkv_proj has one spanning all three):

    out columns (qkv):   [ q: 0 .. 2048 | k: 2048 .. 2560 | v: 2560 .. 3072 ]
    slices[slot, c]  = (start, end, r0, r1, b_row0)     end == start: an unused entry
    out[row, start:end] += s[p, r0:r1] @ b[slot, b_row0 : b_row0 + end - start, :r1 - r0]^T

    s (M, R) float32 (lora_shrink.py)   b (S, NB, RB) each slot's slices' B stacked by rows   out (T, N)
    b is zero past each slice's rank; RB a power of two >= 16 (`padded_rank`) keeps B's loads unmasked

grid = (row blocks of the largest group, N blocks, groups). Program (i, j, g) accumulates the slices
of g's slot that cross its BLOCK_N columns in float32, then reads, adds and writes its out tile once
(a tile no slice crosses is left alone). s is rounded to the weights' dtype for the product, as the
PyTorch reference rounds the shrink result to the model dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.bf16 import store_cast
from pageserve_kernels.checks import (
    FLOAT_DTYPES,
    KernelArgError,
    check_device,
    check_dim,
    check_dtype,
    check_int_index,
    check_last_contiguous,
    exact_bf16,
    upcast_dots,
)
from pageserve_kernels.lora_rows import check_row_groups, group_positions, launch_block_m, lora_dot

SLICE_FIELDS = 5
"""(start, end, r0, r1, b_row0) per slice entry."""


@triton.jit
def _lora_expand_kernel(
    s_ptr,  # (M, R) float32
    b_ptr,  # (S, NB, RB)
    out_ptr,  # (T, N)
    slices_ptr,  # (S, NUM_SLICES, 5) int32
    row_indices_ptr,  # (M,)
    group_start_ptr,  # (G + 1,)
    group_slot_ptr,  # (G,)
    N,
    RB,
    stride_sm,
    stride_bs,
    stride_bn,
    stride_ot,
    NUM_SLICES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    B_PADDED: tl.constexpr,
    UPCAST: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    first, end, pos, row_ok, slot = group_positions(group_start_ptr, group_slot_ptr, BLOCK_M)
    if first >= end:
        return
    n_lo = tl.program_id(1) * BLOCK_N
    n = n_lo + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    crossed = 0
    for c in tl.static_range(NUM_SLICES):
        meta = slices_ptr + (slot * NUM_SLICES + c) * 5
        start = tl.load(meta)
        stop = tl.load(meta + 1)
        r0 = tl.load(meta + 2)
        r1 = tl.load(meta + 3)
        b_row0 = tl.load(meta + 4)
        if (start < n_lo + BLOCK_N) & (stop > n_lo):
            crossed += 1
            n_ok = (n >= start) & (n < stop)
            st = tl.load(s_ptr + pos[:, None] * stride_sm + (r0 + rk)[None, :],
                         mask=row_ok[:, None] & (rk < r1 - r0)[None, :], other=0.0)  # (BLOCK_M, BLOCK_R) fp32
            b_rows = b_ptr + slot * stride_bs + (b_row0 + n - start).to(tl.int64)[None, :] * stride_bn
            # B's rows are zero past each slice's rank, so a slot padded to BLOCK_R needs no rank mask:
            # its loads are whole 16-byte vectors along the rank (a mask read from memory would split them)
            b_ok = n_ok[None, :] if B_PADDED else (rk < RB)[:, None] & n_ok[None, :]
            bt = tl.load(b_rows + rk[:, None], mask=b_ok, other=0.0)  # (BLOCK_R, BLOCK_N)
            if not UPCAST:
                st = st.to(bt.dtype)
            acc += lora_dot(st, bt, UPCAST)
    if crossed == 0:
        return
    rows = tl.load(row_indices_ptr + pos, mask=row_ok, other=0).to(tl.int64)
    out_ptrs = out_ptr + rows[:, None] * stride_ot + n[None, :]
    ok = row_ok[:, None] & (n < N)[None, :]
    total = tl.load(out_ptrs, mask=ok, other=0.0).to(tl.float32) + acc
    tl.store(out_ptrs, store_cast(total, out_ptr.dtype.element_ty, EXACT_BF16), mask=ok)


def padded_rank(rank: int) -> int:
    """The rank tile of the expand: a power of two, at least tl.dot's 16. A b whose last dimension is
    already this wide (device_weights.py pads it) loads without a rank mask."""
    return max(16, triton.next_power_of_2(rank))


def _check(s: torch.Tensor, b: torch.Tensor, slices: torch.Tensor, out: torch.Tensor) -> None:
    check_dim("s", s, 2)
    check_dim("b", b, 3)
    check_dim("out", out, 2)
    check_int_index("slices", slices, 3)
    check_dtype("s", s, (torch.float32,))
    for name, t in (("s", s), ("b", b), ("out", out)):
        check_last_contiguous(name, t)
        check_device(name, t)
        if t.device != out.device:
            raise KernelArgError(name, f"on {t.device}, out on {out.device}")
    for name, t in (("b", b), ("out", out)):
        check_dtype(name, t, FLOAT_DTYPES)
    if b.dtype != out.dtype:
        raise KernelArgError("b", f"dtype {b.dtype} != out's {out.dtype}")
    if slices.dtype != torch.int32 or slices.shape[0] != b.shape[0] or slices.shape[2] != SLICE_FIELDS:
        raise KernelArgError("slices", f"need ({b.shape[0]}, C, {SLICE_FIELDS}) int32, got "
                                       f"{tuple(slices.shape)} {slices.dtype}")
    if not slices.is_contiguous() or slices.device != out.device:
        raise KernelArgError("slices", f"must be contiguous, on {out.device}")


def lora_expand(
    s: torch.Tensor,  # (M, R) float32
    b: torch.Tensor,  # (S, NB, RB)
    slices: torch.Tensor,  # (S, C, 5) int32
    out: torch.Tensor,  # (T, N), added to in place
    row_indices: torch.Tensor,  # (M,) int32/int64
    group_start: torch.Tensor,  # (G + 1,)
    group_slot: torch.Tensor,  # (G,)
    max_rows: int,
) -> None:
    """out[rows of each group, each slice of its slot] += s's slice columns @ that slice's B^T, in place."""
    _check(s, b, slices, out)
    check_row_groups(row_indices, group_start, group_slot, out.device)
    if s.shape[0] != row_indices.shape[0]:
        raise KernelArgError("s", f"{s.shape[0]} rows, row_indices has {row_indices.shape[0]}")
    groups, rank_b = group_slot.shape[0], b.shape[2]
    if groups == 0 or max_rows == 0 or slices.shape[1] == 0:
        return
    block_m, block_n, block_r = launch_block_m(max_rows), 64, padded_rank(rank_b)
    grid = (triton.cdiv(max_rows, block_m), triton.cdiv(out.shape[1], block_n), groups)
    _lora_expand_kernel[grid](
        s, b, out, slices, row_indices, group_start, group_slot, out.shape[1], rank_b,
        s.stride(0), b.stride(0), b.stride(1), out.stride(0),
        NUM_SLICES=slices.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r,
        B_PADDED=rank_b == block_r, UPCAST=upcast_dots(out.dtype),
        EXACT_BF16=exact_bf16(out.dtype),
    )  # fmt: skip


def lora_expand_ref(s: torch.Tensor, b: torch.Tensor, slices: torch.Tensor, out: torch.Tensor,
                    row_indices: torch.Tensor, group_start: torch.Tensor, group_slot: torch.Tensor) -> None:
    """The definition, one group and slice at a time: float32 sums, one rounding into out."""
    bounds = group_start.tolist()
    total = out.float()
    for g, slot in enumerate(group_slot.tolist()):
        rows = row_indices[bounds[g]: bounds[g + 1]].long()
        for start, end, r0, r1, b_row0 in slices[slot].tolist():
            if end > start:
                shrunk = s[bounds[g]: bounds[g + 1], r0:r1].to(b.dtype).float()
                total[rows, start:end] += shrunk @ b[slot, b_row0: b_row0 + end - start, : r1 - r0].float().T
    out.copy_(total.to(out.dtype))
