"""Compile every Triton kernel variant an engine can request, before it serves.

Triton compiles a kernel the first time it sees a new set of constexprs (see
pageserve_kernels/attention_launch.py), so a variant first met mid-serving stalls one
step for a compilation (seconds). The variants depend only on the model's head
shape, the block size, the dtype and the step's longest query chunk (which
picks the tile and whether each request fits one query block); batch size,
context length and split count are runtime values. So the whole set is found
by walking query lengths 1..max_num_batched_tokens, and each variant is then
launched once on a tiny batch over the engine's own cache tensors (their
strides are what the binary specialises on):

    attention_warmup_shapes(...)  -> one WarmupShape per paged-attention variant
    warm_up_kernels(caches, ...)  -> launches them, write_kv and copy_blocks once;
                                     returns the variants, for the start-up log

A model whose layers have sliding windows or soft-caps names the kinds it uses (`kinds`: (window, softcap)
pairs, (0, 0.0) a plain layer): windowed and soft-capped layers run binaries of their own (attention_launch.py's
WINDOWED and SOFTCAPPED), the values themselves are runtime arguments.

The warm-up writes into block 0 of the cache: it runs before any request, so
nothing there is live. This file knows nothing about models or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pageserve_kernels.attention_launch import (
    ATTENTION_DO_NOT_SPECIALIZE,
    KernelVariant,
    attention_constexprs,
    attention_int_args,
    kernel_variant,
    plan_launch,
)
from pageserve_kernels.checks import upcast_dots

CPU = torch.device("cpu")


@dataclass(frozen=True)
class WarmupShape:
    """One request of query_len tokens after context_len cached ones, attended with num_splits parts."""

    query_len: int
    context_len: int
    num_splits: int


def attention_warmup_shapes(n_q: int, n_kv: int, head_dim: int, max_query_len: int) -> list[WarmupShape]:
    """The smallest launch of each distinct paged-attention variant for query chunks up to max_query_len."""
    seen: set[tuple[object, ...]] = set()
    shapes: list[WarmupShape] = []
    for q_len in range(1, max_query_len + 1):
        for split in (False, True):
            plan = plan_launch(q_len, 1, n_q, n_kv, head_dim, q_len, q_len, CPU, num_splits=2 if split else 1)
            if split and not plan.one_q_block:
                continue  # the launcher splits only launches where each request is one query block
            key = (plan.block_m, plan.one_q_block, split, plan.tile_n, plan.num_warps)
            if key not in seen:
                seen.add(key)
                # Two KV tiles of context, so both parts of a split see keys.
                shapes.append(WarmupShape(q_len, 2 * plan.tile_n if split else 0, 2 if split else 1))
    return shapes


def attention_variant_of(
    query: torch.Tensor,  # (T, n_q, hd), any device (meta included)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks)
    max_query_len: int,
    max_seq_len: int,
    num_splits: int | None = None,
    num_stages: int = 3,
    window: int = 0,
    softcap: float = 0.0,
) -> KernelVariant:
    """The binary paged_attention would run for these arguments (no launch, no device access)."""
    num_tokens, n_q, head_dim = query.shape
    n_kv = key_cache.shape[2]
    plan = plan_launch(num_tokens, block_tables.shape[0], n_q, n_kv, head_dim, max_query_len, max_seq_len,
                       query.device if query.device.type == "cuda" else CPU, num_splits=num_splits)
    consts = attention_constexprs(plan, n_q, n_kv, head_dim, key_cache.shape[1], upcast_dots(query.dtype),
                                  windowed=window > 0, softcapped=softcap > 0)
    out = torch.empty_like(query)
    ints = attention_int_args(query, out, key_cache, value_cache, block_tables, plan.num_splits)
    return kernel_variant("paged_attention", consts, ints, ATTENTION_DO_NOT_SPECIALIZE, plan.num_warps,
                          num_stages)


def _warmup_launches(
    key_cache: torch.Tensor, value_cache: torch.Tensor, n_q: int, max_query_len: int
) -> list[tuple[tuple[torch.Tensor, ...], dict[str, int]]]:
    """(paged_attention's tensor arguments, its hints) for each variant; tensors on the cache's device."""
    n_kv, head_dim = key_cache.shape[2], key_cache.shape[3]
    device, dtype, block_size = key_cache.device, key_cache.dtype, key_cache.shape[1]
    launches = []
    for shape in attention_warmup_shapes(n_q, n_kv, head_dim, max_query_len):
        seq_len = shape.context_len + shape.query_len
        query = torch.zeros(shape.query_len, n_q, head_dim, dtype=dtype, device=device)
        # Every logical block maps to block 0: the warm-up must not touch blocks it does not own.
        tables = torch.zeros(1, -(-seq_len // block_size), dtype=torch.int32, device=device)
        starts = torch.tensor([0, shape.query_len], dtype=torch.int32, device=device)
        lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
        hints = {"max_query_len": shape.query_len, "max_seq_len": seq_len, "num_splits": shape.num_splits}
        launches.append(((query, key_cache, value_cache, tables, starts, lens), hints))
    return launches


PLAIN = ((0, 0.0),)
"""A model without sliding windows or soft-caps: every layer attends causally to every key."""


def warmup_variants(
    key_cache: torch.Tensor, value_cache: torch.Tensor, n_q: int, max_query_len: int,
    kinds: tuple[tuple[int, float], ...] = PLAIN,
) -> list[KernelVariant]:
    """The paged-attention variants warm_up_kernels compiles (computed, nothing launched)."""
    variants = {
        attention_variant_of(q, k, v, tables, **hints, window=window, softcap=softcap)
        for (q, k, v, tables, _, _), hints in _warmup_launches(key_cache, value_cache, n_q, max_query_len)
        for window, softcap in kinds
    }
    return sorted(variants, key=lambda v: v.describe())


def warm_up_kernels(
    key_cache: torch.Tensor,  # one layer's caches: every layer shares shape, dtype and strides
    value_cache: torch.Tensor,
    n_q: int,
    max_query_len: int,
    kinds: tuple[tuple[int, float], ...] = PLAIN,
) -> list[KernelVariant]:
    """Launch every Triton variant once (for each (window, softcap) kind of layer); returns the
    paged-attention variants compiled."""
    from pageserve_kernels.copy_blocks import copy_blocks
    from pageserve_kernels.paged_attention import paged_attention
    from pageserve_kernels.write_kv import write_kv

    for args, hints in _warmup_launches(key_cache, value_cache, n_q, max_query_len):
        for window, softcap in kinds:
            paged_attention(*args, 1.0, window, softcap, **hints)
    n_kv, head_dim, device = key_cache.shape[2], key_cache.shape[3], key_cache.device
    kv = torch.zeros(1, n_kv, head_dim, dtype=key_cache.dtype, device=device)
    write_kv(kv, kv, key_cache, value_cache, torch.full((1,), -1, dtype=torch.int64, device=device))
    copy_blocks([key_cache, value_cache], torch.zeros(1, 2, dtype=torch.int64, device=device))
    return warmup_variants(key_cache, value_cache, n_q, max_query_len, kinds)
