"""The tensor-parallel split (pure arithmetic), the sharded weights' algebra, and the flag's refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.config import ConfigError, EngineConfig
from engine.worker.models.spec import ModelSpec
from engine.worker.parallel.partition import check_tensor_parallel, even_split, plan_shards
from ops.launcher import engine_command, parse_args
from tests.engine.model_fixtures import tiny_model  # noqa: F401 (a fixture)

SMOLLM2 = ModelSpec(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                     num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5, rope_scaling=None,
                     tie_word_embeddings=True, attention_bias=False, max_position_embeddings=8192)


def test_smollm2_on_two_ranks_splits_kv_head_groups_unevenly() -> None:
    r0, r1 = plan_shards(SMOLLM2, 2, 0), plan_shards(SMOLLM2, 2, 1)
    assert (r0.kv_heads, r0.q_heads) == ((0, 2), (0, 6))  # KV heads 0, 1 with their 6 query heads
    assert (r1.kv_heads, r1.q_heads) == ((2, 3), (6, 9))
    assert (r0.intermediate, r1.intermediate) == ((0, 768), (768, 1536))
    assert (r0.vocab, r1.vocab) == ((0, 24576), (24576, 49152))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_head_column_and_token_is_held_by_exactly_one_rank(world: int) -> None:
    shape = dataclasses.replace(SMOLLM2, vocab_size=49153, intermediate_size=1537)
    plans = [plan_shards(shape, world, r) for r in range(world)]
    for field, total in (("kv_heads", 3), ("q_heads", 9), ("intermediate", 1537), ("vocab", 49153)):
        ranges = [getattr(p, field) for p in plans]
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(p.vocab_size <= p.vocab_slice for p in plans)


def test_even_split_differs_by_at_most_one() -> None:
    sizes = [b - a for a, b in (even_split(10, 4, r) for r in range(4))]
    assert sizes == [3, 3, 2, 2]


def test_more_ranks_than_kv_heads_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--tensor-parallel-size 4 exceeds the model's 3 KV heads"):
        check_tensor_parallel(SMOLLM2, 4, "cpu")
    with pytest.raises(ConfigError, match="--tensor-parallel-size"):
        check_tensor_parallel(SMOLLM2, 2, "cuda")
    with pytest.raises(ConfigError, match="--tensor-parallel-size must be at least 1"):
        EngineConfig(tensor_parallel_size=0)
    check_tensor_parallel(SMOLLM2, 3, "cpu")


def test_the_engine_refuses_before_spawning_anything(tiny_model: Path) -> None:  # noqa: F811
    from engine.llm import LLM

    with pytest.raises(ConfigError, match="--tensor-parallel-size 3 exceeds the model's 2 KV heads"):
        LLM(str(tiny_model), "float32", num_device_blocks=8, tensor_parallel_size=3)


def test_row_parallel_partial_products_sum_to_the_full_product() -> None:
    """The algebra the all_reduce relies on, with the uneven split: o_proj over 6 + 3 query heads."""
    hd, hidden = 64, 576
    o = torch.randn(hidden, 9 * hd, dtype=torch.float64)
    attn_out = torch.randn(5, 9 * hd, dtype=torch.float64)
    parts = []
    for rank in range(2):
        a, b = plan_shards(SMOLLM2, 2, rank).q_heads
        parts.append(attn_out[:, a * hd: b * hd] @ o[:, a * hd: b * hd].T)
    torch.testing.assert_close(parts[0] + parts[1], attn_out @ o.T)


def test_pageserve_up_passes_the_flag_to_each_engine() -> None:
    cmd = engine_command(["pageserve"], parse_args(["--tensor-parallel-size", "2"]), "tcp://127.0.0.1:1")
    assert cmd[-2:] == ["--tensor-parallel-size", "2"]
    assert "--tensor-parallel-size" not in engine_command(["pageserve"], parse_args([]), "tcp://127.0.0.1:1")
