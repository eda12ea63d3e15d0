"""LoRA shrink: every adapter group's rows times its slot's stacked A, all groups in one launch.

Same contract as `lora_shrink_ref` below (engine/worker/lora/batch.py's `x[rows] A^T`, per group):

    s[p, :rank[slot]] = x[row_indices[p]] @ a[slot, :rank[slot]]^T      for p in group g, slot = group_slot[g]
    x (T, K)   a (S, R, K) stacked A per slot (rows past a slot's rank: never read)   s (M, R) float32

grid = (row blocks of the largest group, R blocks x SPLIT_K, groups). Program (i, j, g) multiplies
BLOCK_M rows of group g by BLOCK_R rows of A over its share of K, accumulating in float32. A decode
step has a row or two per group, so the grid would be one program per group reading all of A (R x K,
tens of KiB) alone: SPLIT_K splits K over that many programs, which add into s atomically (s starts
at zero; the float32 sums then depend on arrival order in the last bits). Rows and slots come from
lora_rows.py's index layout; nothing here knows adapters, layers or projections.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.checks import (
    FLOAT_DTYPES,
    KernelArgError,
    check_device,
    check_dim,
    check_dtype,
    check_int_index,
    check_last_contiguous,
    upcast_dots,
)
from pageserve_kernels.lora_rows import check_row_groups, group_positions, launch_block_m, lora_dot


@triton.jit
def _lora_shrink_kernel(
    x_ptr,  # (T, K)
    a_ptr,  # (S, R, K)
    s_ptr,  # (M, R) float32, zeroed
    row_indices_ptr,  # (M,)
    group_start_ptr,  # (G + 1,)
    group_slot_ptr,  # (G,)
    slot_rank_ptr,  # (S,) rows of a[slot] in use
    K,
    stride_xt,
    stride_as,
    stride_ar,
    stride_sm,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    first, end, pos, row_ok, slot = group_positions(group_start_ptr, group_slot_ptr, BLOCK_M)
    pid_r = tl.program_id(1) // SPLIT_K
    pid_k = tl.program_id(1) % SPLIT_K
    rank = tl.load(slot_rank_ptr + slot)
    if first >= end or pid_r * BLOCK_R >= rank:  # past the group, or past the slot's rank: nothing
        return
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rank
    rows = tl.load(row_indices_ptr + pos, mask=row_ok, other=0).to(tl.int64)
    x_rows = x_ptr + rows[:, None] * stride_xt  # (BLOCK_M, 1)
    a_cols = a_ptr + slot * stride_as + r[None, :] * stride_ar  # (1, BLOCK_R): A^T's columns
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        xt = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        at = tl.load(a_cols + k[:, None], mask=k_ok[:, None] & r_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_R)
        acc += lora_dot(xt, at, UPCAST)
    s_ptrs = s_ptr + pos[:, None] * stride_sm + r[None, :]
    ok = row_ok[:, None] & r_ok[None, :]
    if SPLIT_K == 1:
        tl.store(s_ptrs, acc, mask=ok)
    else:
        tl.atomic_add(s_ptrs, acc, mask=ok)


BLOCK_K = 64
"""The shrink's K tile (its split count depends on it: shrink_split_k)."""


def shrink_block_r(rank: int) -> int:
    """Rows of A per program for a stacked rank (the slots' largest): 16 (tl.dot's least) to 64."""
    return max(16, min(64, triton.next_power_of_2(rank)))


def shrink_split_k(max_rows: int, groups: int, k: int, block_k: int) -> int:
    """K splits for a launch of `groups` groups of up to `max_rows` rows: enough programs to keep a GPU's
    SMs reading A when the rows alone give a handful (decode), none when prompt rows already do. A power
    of two up to 16: each value is a compiled binary, so few values."""
    programs = groups * triton.cdiv(max_rows, launch_block_m(max_rows))
    want = max(1, min(triton.cdiv(k, block_k), 128 // programs, 16))
    return 1 << (want.bit_length() - 1)


def lora_shrink(
    x: torch.Tensor,  # (T, K)
    a: torch.Tensor,  # (S, R, K)
    slot_rank: torch.Tensor,  # (S,) int32
    row_indices: torch.Tensor,  # (M,) int32/int64
    group_start: torch.Tensor,  # (G + 1,)
    group_slot: torch.Tensor,  # (G,)
    max_rows: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """s (M, R) float32: each group's rows of x times its slot's A^T (columns past the slot's rank: 0).
    `max_rows` is the largest group's row count (the host planned it; no device sync here)."""
    check_dim("x", x, 2)
    check_dim("a", a, 3)
    check_int_index("slot_rank", slot_rank, 1)
    for name, t in (("x", x), ("a", a)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_contiguous(name, t)
        check_device(name, t)
    if a.dtype != x.dtype or a.device != x.device:
        raise KernelArgError("a", f"{a.dtype} on {a.device}, x is {x.dtype} on {x.device}")
    if a.shape[2] != x.shape[1]:
        raise KernelArgError("a", f"input width {a.shape[2]} != x's {x.shape[1]}")
    if slot_rank.shape[0] != a.shape[0] or not slot_rank.is_contiguous() or slot_rank.device != x.device:
        raise KernelArgError("slot_rank", f"need {a.shape[0]} contiguous entries (one per slot) on {x.device}")
    check_row_groups(row_indices, group_start, group_slot, x.device)
    num_slots, rank, k = a.shape
    # rows padded to 16 floats: s's row stride, which Triton specialises on, stays one value for any rank
    s = torch.zeros(row_indices.shape[0], -(-rank // 16) * 16, dtype=torch.float32, device=x.device)[:, :rank]
    groups = group_slot.shape[0]
    if groups == 0 or max_rows == 0 or rank == 0:
        return s
    block_m, block_k = launch_block_m(max_rows), BLOCK_K
    block_r = shrink_block_r(rank)
    split_k = split_k or shrink_split_k(max_rows, groups, k, block_k)
    grid = (triton.cdiv(max_rows, block_m), triton.cdiv(rank, block_r) * split_k, groups)
    _lora_shrink_kernel[grid](
        x, a, s, row_indices, group_start, group_slot, slot_rank, k,
        x.stride(0), a.stride(0), a.stride(1), s.stride(0),
        BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=block_k, SPLIT_K=split_k, UPCAST=upcast_dots(x.dtype),
    )  # fmt: skip
    return s


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, slot_rank: torch.Tensor, row_indices: torch.Tensor,
                    group_start: torch.Tensor, group_slot: torch.Tensor) -> torch.Tensor:
    """The definition, one group at a time in float32 (the kernels are tested against it)."""
    s = torch.zeros(row_indices.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    bounds = group_start.tolist()
    for g, slot in enumerate(group_slot.tolist()):
        p0, p1, rank = bounds[g], bounds[g + 1], int(slot_rank[slot])
        s[p0:p1, :rank] = x[row_indices[p0:p1].long()].float() @ a[slot, :rank].float().T
    return s
