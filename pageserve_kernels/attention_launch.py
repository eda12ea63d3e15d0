"""How a paged-attention launch is shaped: tile sizes, grid, split-K count.

Pure host-side arithmetic (no Triton), so the heuristics are testable and
readable on their own; pageserve_kernels/paged_attention.py explains the tiles and
launches the kernel. Knows nothing about models or scheduling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pageserve_kernels.checks import KernelArgError, next_pow2

MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256
"""A split reads at least this many KV tokens, so the merge stays a small cost."""


def choose_num_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """KV splits for a decode batch of `num_programs` (request, KV head) programs.

    Aim at about eight programs per SM: a few resident per SM hide memory latency,
    and many small programs shrink the idle tail of the last wave. A split reads
    at least MIN_TOKENS_PER_SPLIT keys, so the merge (float32 partials, about
    2 * group * splits / context of the KV bytes) stays a small cost.
    """
    if device.type == "cuda":
        target = 8 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 4  # the interpreter: exercise the split path on long contexts only
    by_occupancy = math.ceil(target / max(num_programs, 1))
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    return max(1, min(MAX_SPLITS, by_occupancy, by_length))


@dataclass(frozen=True)
class LaunchPlan:
    """Tile sizes and grid of one paged-attention launch."""

    block_m: int
    """Rows of the M tile: BLOCK_Q query tokens x GROUP query heads, padded to a power of two."""
    block_q: int
    one_q_block: bool
    """Every request fits one query block: one program per request, no search."""
    grid0: int
    num_splits: int
    tile_n: int
    num_warps: int


def plan_launch(
    num_tokens: int,
    batch: int,
    n_q: int,
    n_kv: int,
    head_dim: int,
    max_query_len: int,
    max_seq_len: int,
    device: torch.device,
    *,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
) -> LaunchPlan:
    group = n_q // n_kv
    # Small M tiles for decode (KV-bandwidth bound), large ones for prefill so each
    # KV tile loaded serves many query tokens.
    small_m = max(16, next_pow2(group))  # one query token's heads, at least tl.dot's 16 rows
    block_m = small_m if max_query_len * group <= small_m else max(64, next_pow2(group))
    block_q = block_m // group
    one_q_block = max_query_len <= block_q
    grid0 = batch if one_q_block else num_tokens // block_q + batch
    if num_splits is None:  # split only decode-like launches; prefill has programs to spare
        num_splits = choose_num_splits(grid0 * n_kv, max_seq_len, device) if one_q_block else 1
    if not 1 <= num_splits <= 1024:
        raise KernelArgError("num_splits", f"{num_splits} not in [1, 1024]")
    if tile_n is None:
        tile_n = 64 if head_dim <= 128 else 32
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise KernelArgError("tile_n", f"{tile_n} is not a power of two >= 16")
    warps = num_warps or (4 if block_m <= 16 else 8)
    return LaunchPlan(block_m, block_q, one_q_block, grid0, num_splits, tile_n, warps)
