"""Swap KV blocks between the device pool and the CPU pool: one transfer per step.

Same contract as `pageserve_kernels.reference.swap_blocks_ref`, but over every layer's
cache at once: block src_dst[i, 0] of each src cache goes to block
src_dst[i, 1] of the matching dst cache.

Why no Triton kernel here: a Triton program cannot portably read or write
pinned host memory, so a cross-device swap is three steps, with exactly one
host<->device copy however many blocks and layers move:

    src pool --index_select per layer--> staging (L, N, block) on src device
    staging --one copy--> staging on dst device
    staging --index_copy_ per layer--> dst pool

Device -> CPU copies block (the CPU scatter needs the data); CPU -> device
copies go from pinned memory without blocking the host. Within one device
(CPU tests, or both pools on one GPU) the staging copy is skipped.
This file knows nothing about which requests were preempted.
"""

from __future__ import annotations

import torch

from pageserve_kernels.checks import KernelArgError, check_int_index


def _check(src_caches: list[torch.Tensor], dst_caches: list[torch.Tensor], src_dst: torch.Tensor) -> None:
    if not src_caches or len(src_caches) != len(dst_caches):
        raise KernelArgError("dst_caches", f"{len(dst_caches)} caches for {len(src_caches)} source caches")
    check_int_index("src_dst", src_dst, 2)
    if src_dst.shape[1] != 2:
        raise KernelArgError("src_dst", f"need (N, 2), got {tuple(src_dst.shape)}")
    block_shape, dtype = src_caches[0].shape[1:], src_caches[0].dtype
    for name, caches in (("src_caches", src_caches), ("dst_caches", dst_caches)):
        for i, c in enumerate(caches):
            if c.dim() != 4 or c.shape[1:] != block_shape or c.dtype != dtype:
                raise KernelArgError(
                    f"{name}[{i}]", f"{tuple(c.shape)} {c.dtype} does not match src_caches[0]"
                )
            if c.device != caches[0].device:
                raise KernelArgError(f"{name}[{i}]", "all caches of one pool must share a device")


def swap_blocks(
    src_caches: list[torch.Tensor],  # each (num_blocks_src, block_size, n_kv, hd)
    dst_caches: list[torch.Tensor],  # each (num_blocks_dst, block_size, n_kv, hd), the other pool
    src_dst: torch.Tensor,  # (N, 2) int pairs (block in src pool, block in dst pool)
) -> None:
    _check(src_caches, dst_caches, src_dst)
    if src_dst.shape[0] == 0:
        return
    src_device, dst_device = src_caches[0].device, dst_caches[0].device
    src_idx = src_dst[:, 0].to(device=src_device, dtype=torch.int64)
    dst_idx = src_dst[:, 1].to(device=dst_device, dtype=torch.int64)
    if src_device == dst_device:
        for src, dst in zip(src_caches, dst_caches, strict=True):
            dst.index_copy_(0, dst_idx, src.index_select(0, src_idx))
        return
    num_layers, n = len(src_caches), src_dst.shape[0]
    block_shape = src_caches[0].shape[1:]
    pin = src_device.type == "cpu" and torch.cuda.is_available()
    staging = torch.empty(
        (num_layers, n, *block_shape), dtype=src_caches[0].dtype, device=src_device, pin_memory=pin
    )  # (L, N, block_size, n_kv, hd)
    for layer, src in enumerate(src_caches):
        torch.index_select(src, 0, src_idx, out=staging[layer])
    moved = staging.to(dst_device, non_blocking=pin)
    for layer, dst in enumerate(dst_caches):
        dst.index_copy_(0, dst_idx, moved[layer])
