"""How a paged-attention launch is shaped: tile sizes, grid, split-K count, and what it compiles.

Pure host-side arithmetic (no Triton), so the heuristics are testable and
readable on their own; pageserve_kernels/paged_attention.py explains the tiles and
launches the kernel. Knows nothing about models or scheduling.

Compilation. Triton compiles one binary per distinct set of constexpr values
(and per specialisation of plain integer arguments: a value of 1, or a
multiple of 16). Everything that changes from step to step while serving
(batch size, split count, block-table width) is therefore a runtime argument
marked `do_not_specialize` (ATTENTION_DO_NOT_SPECIALIZE), and the constexprs
(`attention_constexprs`) take only a handful of values per model: small or
large M tile, one query block per request or not, split-K or not. vLLM's
decode kernel does the same with its fixed segment count. `attention_variant`
names the binary a launch needs; pageserve_kernels/warmup.py compiles every one of them
at start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pageserve_kernels.checks import KernelArgError, next_pow2

MAX_SPLITS = 64
"""The split count is a runtime argument in [1, MAX_SPLITS]; it never selects a new binary."""
ATTENTION_DO_NOT_SPECIALIZE = ("num_seqs", "num_splits", "stride_bt", "stride_qt", "stride_ot", "window")
"""Integer arguments of the paged-attention kernel that vary while serving (batch size, split count,
block-table width), or that differ between the engine's strided views and the warm-up's dense
tensors (token strides, read once per program): no binary per value."""
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
    if not 1 <= num_splits <= MAX_SPLITS:
        raise KernelArgError("num_splits", f"{num_splits} not in [1, {MAX_SPLITS}]")
    if tile_n is None:
        tile_n = 64 if head_dim <= 128 else 32
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise KernelArgError("tile_n", f"{tile_n} is not a power of two >= 16")
    # 4 warps up to 64-row tiles: a 2,048-token bf16 prefill (hd 128) took 0.209 ms with 4 and 0.314 ms
    # with 8 on an H200 (graph-replayed; ops/gpu_check "prefill warps"), FlashAttention-2's 64-row choice.
    warps = num_warps or (4 if block_m <= 64 else 8)
    return LaunchPlan(block_m, block_q, one_q_block, grid0, num_splits, tile_n, warps)


def attention_constexprs(
    plan: LaunchPlan, n_q: int, n_kv: int, head_dim: int, block_size: int, upcast: bool,
    windowed: bool = False, softcapped: bool = False,
) -> dict[str, int | bool]:
    """The compile-time constants of one paged-attention launch (everything else is a runtime value).

    WINDOWED and SOFTCAPPED say whether a layer has a sliding window or a soft-cap at all (their values are
    runtime arguments): a plain layer's binary carries neither the extra compare nor the tanh."""
    return {
        "HEAD_DIM": head_dim,
        "HEAD_DIM_P": max(16, next_pow2(head_dim)),
        "GROUP": n_q // n_kv,
        "BLOCK_M": plan.block_m,
        "BLOCK_Q": plan.block_q,
        "BLOCK_SIZE": block_size,
        "TILE_N": plan.tile_n,
        "SPLIT_K": plan.num_splits > 1,
        "ONE_Q_BLOCK": plan.one_q_block,
        "UPCAST": upcast,
        "WINDOWED": windowed,
        "SOFTCAPPED": softcapped,
    }


def int_specialization(value: int) -> str:
    """How Triton specialises a plain integer argument: "1", "D" (multiple of 16) or "" (any)."""
    if value == 1:
        return "1"
    return "D" if value % 16 == 0 else ""


@dataclass(frozen=True)
class KernelVariant:
    """One compiled binary of a kernel: what Triton keys its cache on (pointer dtypes aside)."""

    kernel: str
    constexprs: tuple[tuple[str, int | bool], ...]
    int_specializations: tuple[tuple[str, str], ...]
    num_warps: int
    num_stages: int

    def describe(self) -> str:
        consts = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.constexprs)
        return f"{self.kernel} {consts} warps={self.num_warps} stages={self.num_stages}"


def kernel_variant(
    kernel: str,
    constexprs: dict[str, int | bool],
    int_args: dict[str, int],
    do_not_specialize: tuple[str, ...],
    num_warps: int,
    num_stages: int,
) -> KernelVariant:
    specs = tuple((k, int_specialization(v)) for k, v in sorted(int_args.items()) if k not in do_not_specialize)
    return KernelVariant(kernel, tuple(sorted(constexprs.items())), specs, num_warps, num_stages)


def attention_int_args(
    query: torch.Tensor,  # (T, n_q, hd)
    out: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    num_splits: int,
) -> dict[str, int]:
    """The paged-attention kernel's plain integer arguments (strides and counts), by name."""
    return {
        "num_seqs": block_tables.shape[0],
        "num_splits": num_splits,
        "stride_qt": query.stride(0),
        "stride_qh": query.stride(1),
        "stride_ot": out.stride(0),
        "stride_oh": out.stride(1),
        "stride_kb": key_cache.stride(0),
        "stride_ks": key_cache.stride(1),
        "stride_kh": key_cache.stride(2),
        "stride_vb": value_cache.stride(0),
        "stride_vs": value_cache.stride(1),
        "stride_vh": value_cache.stride(2),
        "stride_bt": block_tables.stride(0),
        "n_q_heads": query.shape[1],
    }
