"""engine/worker/kv_cache.py: sizing from the budget, and swap/copy moving exactly the right blocks."""

from __future__ import annotations

import pytest
import torch

from engine.config import CacheConfig, ConfigError
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.models.spec import ModelSpec

SHAPE = ModelSpec(
    vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=3, num_heads=2, num_kv_heads=2, head_dim=4,
    rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=None, tie_word_embeddings=True, attention_bias=False,
    max_position_embeddings=64,
)


def make_cache(device_blocks: int = 6, cpu_blocks: int = 4) -> KVCache:
    layout = CacheLayout(2, device_blocks, cpu_blocks, 3, 2, 4, torch.float32)
    cache = KVCache(layout)
    # every (layer, k/v, block) gets a distinct fill value: 1000 * layer + 100 * kv + block
    for layer in range(3):
        for kv in range(2):
            for b in range(device_blocks):
                cache.device_pool[layer, kv, b] = 1000 * layer + 100 * kv + b
            cache.cpu_pool[layer, kv] = -1.0
    return cache


def block_value(pool: torch.Tensor, layer: int, kv: int, block: int) -> float:
    values = pool[layer, kv, block].unique()
    assert values.numel() == 1
    return float(values[0])


def test_layout_from_memory_budget() -> None:
    per_block = 2 * 3 * 16 * 2 * 4 * 4  # K and V, 3 layers, 16 tokens, 2 heads, head_dim 4, float32
    layout = CacheLayout.from_budget(CacheConfig(kv_cache_memory=10 * per_block + 5, swap_space=3 * per_block), SHAPE,
                                     torch.float32)
    assert (layout.num_device_blocks, layout.num_cpu_blocks, layout.bytes_per_block) == (10, 3, per_block)
    with pytest.raises(ConfigError):
        CacheLayout.from_budget(CacheConfig(kv_cache_memory=per_block - 1), SHAPE, torch.float32)


def test_layer_views_alias_the_pool() -> None:
    cache = make_cache()
    k, v = cache.layers[1]
    assert k.shape == (6, 2, 2, 4) and k.is_contiguous()
    assert float(k[3].unique()[0]) == 1003.0
    assert float(v[5].unique()[0]) == 1105.0


def test_swap_out_then_in_round_trips_every_layer() -> None:
    cache = make_cache()
    cache.move_blocks(swap_out=[(1, 0), (4, 3)], swap_in=[], copy=[])
    cache.synchronize()
    for layer in range(3):
        for kv in range(2):
            assert block_value(cache.cpu_pool, layer, kv, 0) == 1000 * layer + 100 * kv + 1
            assert block_value(cache.cpu_pool, layer, kv, 3) == 1000 * layer + 100 * kv + 4
            assert block_value(cache.cpu_pool, layer, kv, 1) == -1.0  # untouched
    cache.device_pool[:, :, [1, 4]] = 0.0
    cache.move_blocks(swap_out=[], swap_in=[(3, 2), (0, 5)], copy=[])
    for layer in range(3):
        for kv in range(2):
            assert block_value(cache.device_pool, layer, kv, 2) == 1000 * layer + 100 * kv + 4
            assert block_value(cache.device_pool, layer, kv, 5) == 1000 * layer + 100 * kv + 1
            assert block_value(cache.device_pool, layer, kv, 0) == 1000 * layer + 100 * kv + 0


def test_swaps_read_before_writing() -> None:
    """Device block 2 is swapped out and reused by a swap-in in the same step; CPU block 1 likewise."""
    cache = make_cache()
    cache.cpu_pool[:, :, 1] = 7.0
    cache.move_blocks(swap_out=[(2, 1)], swap_in=[(1, 2)], copy=[])
    cache.synchronize()
    assert block_value(cache.cpu_pool, 2, 1, 1) == 2102.0
    assert block_value(cache.device_pool, 2, 1, 2) == 7.0


def test_copy_blocks_copies_after_swaps() -> None:
    cache = make_cache()
    cache.move_blocks(swap_out=[], swap_in=[], copy=[(0, 3), (5, 1)])
    for layer in range(3):
        assert block_value(cache.device_pool, layer, 1, 3) == 1000 * layer + 100
        assert block_value(cache.device_pool, layer, 0, 1) == 1000 * layer + 5
        assert block_value(cache.device_pool, layer, 0, 0) == 1000 * layer  # source intact
