"""Copy-on-write: copy whole KV blocks src -> dst in every cache, in one launch.

Same contract as `pageserve_kernels.reference.copy_blocks_ref`. The caches (K and V of
every layer, allocated separately) are reached through a small table of their
base addresses, so one launch covers all layers and all pairs:

    grid = (pairs, caches, chunks of a block)
    program (i, c, j) copies elements [j * TILE, (j + 1) * TILE) of block
    src_dst[i, 0] to block src_dst[i, 1] in cache c

The address table is built once per set of caches and reused. This file knows
nothing about which blocks are shared; the scheduler decides the pairs.
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
)

TILE = 1024
_ADDRESS_TABLES: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}


@triton.jit
def _copy_blocks_kernel(
    first_cache_ptr,  # typed pointer to caches[0]: only its element type is used
    cache_addresses_ptr,  # (num_caches,) int64 base addresses
    src_dst_ptr,  # (N, 2)
    block_numel,
    TILE: tl.constexpr,
):
    pair = tl.program_id(0)
    cache = tl.load(cache_addresses_ptr + tl.program_id(1)).to(
        tl.pointer_type(first_cache_ptr.dtype.element_ty)
    )
    src = tl.load(src_dst_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(src_dst_ptr + 2 * pair + 1).to(tl.int64)
    i = tl.program_id(2).to(tl.int64) * TILE + tl.arange(0, TILE)
    ok = i < block_numel
    tl.store(cache + dst * block_numel + i, tl.load(cache + src * block_numel + i, mask=ok), mask=ok)


def _address_table(caches: list[torch.Tensor]) -> torch.Tensor:
    """The int64 base addresses of the caches, on their device; cached per cache set."""
    key = (caches[0].device, tuple(c.data_ptr() for c in caches))
    table = _ADDRESS_TABLES.get(key)
    if table is None:
        if len(_ADDRESS_TABLES) > 16:  # caches are allocated once per engine; stay bounded anyway
            _ADDRESS_TABLES.clear()
        table = torch.tensor(key[1], dtype=torch.int64, device=caches[0].device)
        _ADDRESS_TABLES[key] = table
    return table


def copy_blocks(
    caches: list[torch.Tensor],  # each (num_blocks, block_size, n_kv, hd), same shape and dtype
    src_dst: torch.Tensor,  # (N, 2) int: copy block src -> dst in every cache
) -> None:
    if not caches:
        raise KernelArgError("caches", "empty list")
    check_int_index("src_dst", src_dst, 2)
    if src_dst.shape[1] != 2 or not src_dst.is_contiguous():
        raise KernelArgError("src_dst", f"need a contiguous (N, 2) tensor, got {tuple(src_dst.shape)}")
    first = caches[0]
    check_dim("caches[0]", first, 4)
    check_dtype("caches[0]", first, FLOAT_DTYPES)
    check_device("caches[0]", first)
    for i, c in enumerate(caches):
        if c.shape != first.shape or c.dtype != first.dtype or c.device != first.device:
            raise KernelArgError(f"caches[{i}]", "shape, dtype and device must match caches[0]")
        if not c.is_contiguous():
            raise KernelArgError(f"caches[{i}]", "must be contiguous (blocks are copied as flat runs)")
    if src_dst.device != first.device:
        raise KernelArgError("src_dst", f"on {src_dst.device}, caches on {first.device}")
    if src_dst.shape[0] == 0:
        return
    block_numel = first[0].numel()
    grid = (src_dst.shape[0], len(caches), triton.cdiv(block_numel, TILE))
    _copy_blocks_kernel[grid](first, _address_table(caches), src_dst, block_numel, TILE=TILE)
