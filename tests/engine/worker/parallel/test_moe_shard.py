"""A SparseMoE's tensor-parallel shards: their partial outputs sum to the full layer's output (the all_reduce)."""

from __future__ import annotations

import pytest
import torch

from engine.worker.layers.moe import SparseMoE
from engine.worker.parallel.moe_shard import shard_moe

H, INTER, E, K, SHARED = 64, 48, 8, 2, 96


def _random_moe(shared: int | None, dtype: torch.dtype = torch.float32) -> SparseMoE:
    g = torch.Generator().manual_seed(0)
    moe = SparseMoE(H, INTER, E, K, norm_topk_prob=True, dtype=dtype, shared_expert_intermediate_size=shared)
    for p in moe.parameters():
        p.data = (torch.randn(p.shape, generator=g) * 0.2).to(dtype)
    return moe


@pytest.mark.parametrize("world", [1, 2, 3, 5])  # 48 columns on 5 ranks: 10, 10, 10, 9, 9
@pytest.mark.parametrize("shared", [None, SHARED])
def test_sum_of_rank_outputs_is_the_full_output(world: int, shared: int | None) -> None:
    full = _random_moe(shared)
    x = torch.randn(37, H, generator=torch.Generator().manual_seed(1))
    shards = [shard_moe(full, world, rank) for rank in range(world)]
    assert sum(s.intermediate_size for s in shards) == INTER
    assert all(s.experts_gate_up.shape == (E, 2 * s.intermediate_size, H) for s in shards)
    if shared is not None:
        assert sum(s.shared_intermediate_size or 0 for s in shards) == SHARED
    torch.testing.assert_close(sum(s(x) for s in shards), full(x), atol=1e-5, rtol=1e-5)


def test_bfloat16_shards_round_each_partial_once() -> None:
    full = _random_moe(SHARED, torch.bfloat16)
    x = torch.randn(37, H, generator=torch.Generator().manual_seed(1)).bfloat16()
    parts = [shard_moe(full, 2, rank)(x).float() for rank in range(2)]
    want = full(x).float()
    ulp = 2.0 ** (torch.frexp(want.abs().max()).exponent.item() - 8)
    torch.testing.assert_close(parts[0] + parts[1], want, atol=2 * ulp, rtol=0)  # two roundings instead of one


def test_shards_are_copies() -> None:
    full = _random_moe(SHARED)
    shard = shard_moe(full, 2, 0)
    full.experts_gate_up.data.zero_()
    full.router_weight.data.zero_()
    assert shard.experts_gate_up.abs().sum() > 0 and shard.router_weight.abs().sum() > 0
