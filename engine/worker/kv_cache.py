"""The KV cache memory: the device pool that attention reads, the CPU pool that swaps go to.

One tensor per pool holds every layer, K and V:

    pool: (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
           layer l's K cache = pool[l, 0], its V cache = pool[l, 1]   (contiguous views,
           the layout of pageserve_kernels/reference.py)

so moving blocks is one gather and one scatter per step for all layers at once:
a swap out, swap in or copy never loops over blocks or layers in Python.
The block count comes from a memory budget (`CacheLayout.from_budget`); it is a
start-up value kept here, never written back into the config. This module
knows which bytes live where, nothing about which request owns them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import CacheConfig, ConfigError
from engine.worker.models.llama import LlamaShape


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
    def from_budget(cls, cache: CacheConfig, shape: LlamaShape, dtype: torch.dtype) -> CacheLayout:
        per_block = shape.kv_bytes_per_token(dtype) * cache.block_size
        device = cache.num_device_blocks if cache.num_device_blocks is not None else cache.kv_cache_memory // per_block
        cpu = cache.num_cpu_blocks if cache.num_cpu_blocks is not None else cache.swap_space // per_block
        if device < 1:
            raise ConfigError(
                f"kv_cache_memory={cache.kv_cache_memory} bytes holds no block of {per_block} bytes"
            )
        return cls(cache.block_size, device, cpu, shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)


class KVCache:
    def __init__(self, layout: CacheLayout, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        block = (layout.block_size, layout.num_kv_heads, layout.head_dim)
        # Zero-filled, not empty: padded decode slots are masked, and 0 * garbage-NaN would still poison.
        self.device_pool = torch.zeros(
            layout.num_layers, 2, layout.num_device_blocks, *block, dtype=layout.dtype, device=device
        )
        self.cpu_pool = torch.zeros(layout.num_layers, 2, layout.num_cpu_blocks, *block, dtype=layout.dtype)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (self.device_pool[i, 0], self.device_pool[i, 1]) for i in range(layout.num_layers)
        ]
        """Per layer (K cache, V cache), each (num_device_blocks, block_size, n_kv, hd)."""

    def move_blocks(
        self,
        swap_out: list[tuple[int, int]],
        swap_in: list[tuple[int, int]],
        copy: list[tuple[int, int]],
    ) -> None:
        """Swap out (device -> cpu), swap in (cpu -> device), then copy (device -> device).

        Both swaps read before either writes, so a block freed by one direction may be
        reused by the other in the same step.
        """
        out_data = self._read(self.device_pool, [s for s, _ in swap_out])
        in_data = self._read(self.cpu_pool, [s for s, _ in swap_in])
        if out_data is not None:
            self._write(self.cpu_pool, [d for _, d in swap_out], out_data)
        if in_data is not None:
            self._write(self.device_pool, [d for _, d in swap_in], in_data)
        if copy:
            data = self._read(self.device_pool, [s for s, _ in copy])
            assert data is not None
            self._write(self.device_pool, [d for _, d in copy], data)

    @staticmethod
    def _read(pool: torch.Tensor, blocks: list[int]) -> torch.Tensor | None:
        if not blocks:
            return None
        index = torch.tensor(blocks, dtype=torch.int64, device=pool.device)
        return pool.index_select(2, index)  # (L, 2, N, block_size, n_kv, hd)

    @staticmethod
    def _write(pool: torch.Tensor, blocks: list[int], data: torch.Tensor) -> None:
        index = torch.tensor(blocks, dtype=torch.int64, device=pool.device)
        pool.index_copy_(2, index, data.to(pool.device))
