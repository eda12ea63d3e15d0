"""The rows of a step's adapter groups as the LoRA kernels read them (lora_shrink.py, lora_expand.py),
and the two kernels' shared Triton helpers.

Every group of rows under one adapter is a segment of one index list, so one launch covers all groups:

    row_indices   [ 0 3 | 2 4 5 6 | 9 ]     rows of the step (T rows; base rows appear nowhere)
    group_start   [ 0     2         6   7 ] group g owns positions group_start[g] .. group_start[g + 1]
    group_slot    [ a     b         a ]     the weight slot each group reads (two groups may share one)

Position p (0 <= p < M) is also the row of the shrink output, so the expand finds row p's shrunk
vector without a second index. grid axis 0 walks a group's positions BLOCK_M at a time, grid axis 2
is the group; programs past their group's end return at once (the launch is sized by the largest
group, known on the host when the step is planned). Nothing here knows adapters or projections.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pageserve_kernels.checks import KernelArgError, check_int_index


@triton.jit
def group_positions(group_start_ptr, group_slot_ptr, BLOCK_M: tl.constexpr):
    """(first position, positions of this program's BLOCK_M rows, which are valid, slot) for program
    (pid_m, _, group); first >= the group's end means there is nothing to do."""
    group = tl.program_id(2)
    start = tl.load(group_start_ptr + group).to(tl.int64)
    end = tl.load(group_start_ptr + group + 1).to(tl.int64)
    first = start + tl.program_id(0).to(tl.int64) * BLOCK_M
    pos = first + tl.arange(0, BLOCK_M)
    slot = tl.load(group_slot_ptr + group).to(tl.int64)
    return first, end, pos, pos < end, slot


@triton.jit
def lora_dot(a, b, UPCAST: tl.constexpr):
    """a @ b accumulated in float32; float32 operands stay exact (no TF32 rounding: LoRA products are
    memory-bound, the exact product costs nothing), bfloat16 widened under the interpreter (checks.py)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


def check_row_groups(row_indices: torch.Tensor, group_start: torch.Tensor, group_slot: torch.Tensor,
                     device: torch.device) -> None:
    """Shapes, dtypes and devices of the three index tensors (values are the planner's promise)."""
    check_int_index("row_indices", row_indices, 1)
    check_int_index("group_start", group_start, 1)
    check_int_index("group_slot", group_slot, 1)
    if group_start.shape[0] != group_slot.shape[0] + 1:
        raise KernelArgError("group_start", f"need G + 1 = {group_slot.shape[0] + 1} entries, "
                                            f"got {group_start.shape[0]}")
    for name, t in (("row_indices", row_indices), ("group_start", group_start), ("group_slot", group_slot)):
        if not t.is_contiguous():
            raise KernelArgError(name, "must be contiguous")
        if t.device != device:
            raise KernelArgError(name, f"on {t.device}, the data on {device}")


def launch_block_m(max_rows: int) -> int:
    """Rows per program: 16 (tl.dot's least) for decode-sized groups, up to 64 for prompt chunks."""
    return max(16, min(64, triton.next_power_of_2(max(1, max_rows))))
