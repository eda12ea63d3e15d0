"""Launch shapes of paged attention: decode is one program per (request, KV head, split)."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.attention_launch import choose_num_splits, plan_launch
from pageserve_kernels.checks import KernelArgError

CPU = torch.device("cpu")


def test_decode_is_one_small_tile_per_request() -> None:
    plan = plan_launch(8, 8, n_q=32, n_kv=8, head_dim=128, max_query_len=1, max_seq_len=4096, device=CPU)
    assert (plan.block_m, plan.block_q, plan.one_q_block, plan.grid0) == (16, 4, True, 8)
    assert plan.num_warps == 4 and plan.tile_n == 64


def test_prefill_uses_large_tiles_and_the_request_search() -> None:
    plan = plan_launch(300, 3, n_q=9, n_kv=3, head_dim=64, max_query_len=200, max_seq_len=400, device=CPU)
    assert (plan.block_m, plan.block_q, plan.one_q_block) == (64, 21, False)
    assert plan.grid0 == 300 // 21 + 3 and plan.num_splits == 1
    assert plan.num_warps == 4  # 8 warps took 1.5x as long on a 64-row prefill tile on an H200


def test_odd_group_pads_rows() -> None:
    plan = plan_launch(2, 2, n_q=7, n_kv=1, head_dim=64, max_query_len=2, max_seq_len=64, device=CPU)
    assert (plan.block_m, plan.block_q, plan.one_q_block) == (16, 2, True)  # 14 of 16 rows used
    wide = plan_launch(2, 2, n_q=32, n_kv=1, head_dim=64, max_query_len=1, max_seq_len=64, device=CPU)
    assert (wide.block_m, wide.block_q) == (32, 1)


def test_splits_only_for_long_decode_contexts() -> None:
    assert choose_num_splits(num_programs=1, max_seq_len=100, device=CPU) == 1
    assert choose_num_splits(num_programs=1, max_seq_len=4096, device=CPU) == 4
    assert choose_num_splits(num_programs=64, max_seq_len=4096, device=CPU) == 1


@pytest.mark.parametrize("override, arg", [({"num_splits": 0}, "num_splits"), ({"tile_n": 48}, "tile_n")])
def test_bad_overrides(override, arg) -> None:
    with pytest.raises(KernelArgError) as info:
        plan_launch(1, 1, n_q=2, n_kv=1, head_dim=64, max_query_len=1, max_seq_len=8, device=CPU, **override)
    assert info.value.arg == arg
