"""The KV cache memory: the device pool that attention reads, the CPU pool that swaps go to.

One tensor per pool holds every layer, K and V:

    pool: (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
           layer l's K cache = pool[l, 0], its V cache = pool[l, 1]   (contiguous views,
           the layout of pageserve_kernels/reference.py)

so moving blocks is one gather and one scatter per step for all layers at once:
a swap out, swap in or copy never loops over blocks or layers in Python. The
moves go through pageserve_kernels/block_moves.py (the one path on every device: the
attention backend's copy_blocks for copy-on-write; on a GPU, swaps on a side
stream to a pinned CPU pool).
The block count comes from a memory budget (`CacheLayout.from_budget`); it is a
start-up value kept here, never written back into the config. This module
knows which bytes live where, nothing about which request owns them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import CacheConfig, ConfigError
from engine.worker.host_allocator import zeros_on_huge_pages
from engine.worker.models.spec import ModelSpec
from pageserve_kernels.block_moves import CopyBlocksFn, select_block_mover
from pageserve_kernels.dispatch import copy_blocks_torch


@dataclass(frozen=True)
class CacheLayout:
    """How many blocks fit, derived once at start-up from the budgets."""

    block_size: int
    num_device_blocks: int
    num_cpu_blocks: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @classmethod
    def from_budget(cls, cache: CacheConfig, shape: ModelSpec, dtype: torch.dtype) -> CacheLayout:
        per_block = shape.kv_bytes_per_token(dtype) * cache.block_size
        device = cache.num_device_blocks if cache.num_device_blocks is not None else cache.kv_cache_memory // per_block
        cpu = cache.num_cpu_blocks if cache.num_cpu_blocks is not None else cache.swap_space // per_block
        if device < 1:
            raise ConfigError(
                f"kv_cache_memory={cache.kv_cache_memory} bytes holds no block of {per_block} bytes"
            )
        return cls(cache.block_size, device, cpu, shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)


class KVCache:
    def __init__(
        self, layout: CacheLayout, device: torch.device | str = "cpu", copy_blocks: CopyBlocksFn = copy_blocks_torch
    ) -> None:
        """`copy_blocks`: the attention backend's (pageserve_kernels.dispatch.AttentionBackend.copy_blocks)."""
        self.layout = layout
        block = (layout.block_size, layout.num_kv_heads, layout.head_dim)
        # Zero-filled, not empty: padded decode slots are masked, and 0 * garbage-NaN would still poison.
        shape = (layout.num_layers, 2, layout.num_device_blocks, *block)
        if torch.device(device).type == "cpu":  # read a few KB here and there: huge pages spare the TLB misses
            self.device_pool = zeros_on_huge_pages(shape, layout.dtype)
        else:
            self.device_pool = torch.zeros(shape, dtype=layout.dtype, device=device)
        # Pinned when the device pool is on a GPU: swaps are then asynchronous DMA transfers.
        pin = self.device_pool.device.type == "cuda"
        self.cpu_pool = torch.zeros(
            layout.num_layers, 2, layout.num_cpu_blocks, *block, dtype=layout.dtype, pin_memory=pin
        )
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (self.device_pool[i, 0], self.device_pool[i, 1]) for i in range(layout.num_layers)
        ]
        """Per layer (K cache, V cache), each (num_device_blocks, block_size, n_kv, hd)."""
        self.mover = select_block_mover(self.device_pool, self.cpu_pool, copy_blocks)

    def move_blocks(
        self,
        swap_out: list[tuple[int, int]],
        swap_in: list[tuple[int, int]],
        copy: list[tuple[int, int]],
    ) -> None:
        """Swap out (device -> cpu), swap in (cpu -> device), then copy (device -> device).

        Every source is read before any destination is written, so a block freed by one
        direction may be reused by the other in the same step. A swap-out reaches the CPU
        pool by the next step's move_blocks (or `synchronize`).
        """
        self.mover.begin_step()
        self.mover.swap_out(swap_out)
        self.mover.swap_in(swap_in)
        self.mover.copy_on_write(copy)

    def synchronize(self) -> None:
        """Every move so far is complete in both pools (tests, and before reading the CPU pool)."""
        self.mover.synchronize()
