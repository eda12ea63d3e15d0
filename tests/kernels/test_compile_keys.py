"""No compilation while serving: every binary a decode or mixed sweep asks for is one the warm-up compiled.

Pure Python on the meta device: the launcher's own plan, constexprs and
integer arguments (pageserve_kernels/attention_launch.py) give the key Triton compiles
on, for tensors shaped and strided like the engine's (the query is a view of
the fused QKV rows, the caches are views of one pool).
"""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.attention_launch import MAX_SPLITS, int_specialization
from pageserve_kernels.warmup import attention_variant_of, attention_warmup_shapes, warmup_variants

META = torch.device("meta")
N_Q, N_KV, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16  # SmolLM2-135M's attention
MAX_BATCHED_TOKENS = 512


def engine_caches(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    pool = torch.empty(4, 2, 4096, BLOCK_SIZE, N_KV, HEAD_DIM, dtype=dtype, device=META)
    return pool[1, 0], pool[1, 1]


def step_variant(q_lens: list[int], seq_lens: list[int], dtype: torch.dtype) -> object:
    """The paged-attention binary the engine's step of these chunks launches."""
    key_cache, value_cache = engine_caches(dtype)
    tokens = sum(q_lens)
    query = torch.empty(tokens, N_Q + 2 * N_KV, HEAD_DIM, dtype=dtype, device=META)[:, :N_Q]
    tables = torch.empty(len(q_lens), -(-max(seq_lens) // BLOCK_SIZE), dtype=torch.int32, device=META)
    return attention_variant_of(query, key_cache, value_cache, tables, max(q_lens), max(seq_lens))


def decode_sweep(dtype: torch.dtype) -> set[object]:
    keys = set()
    for batch in (1, 2, 3, 5, 16, 17, 64, 255, 256):
        for context in (1, 2, 15, 16, 17, 255, 256, 511, 512, 1000, 2047, 2048, 4095, 4096, 8192):
            keys.add(step_variant([1] * batch, [context] * batch, dtype))
    return keys


def mixed_sweep(dtype: torch.dtype) -> set[object]:
    keys = set()
    for decodes in (0, 1, 7, 32):
        for chunk in (2, 5, 6, 17, 21, 22, 64, 100, 256, 511, MAX_BATCHED_TOKENS - decodes):
            for context in (0, 16, 700, 3000):
                q_lens = [1] * decodes + [chunk]
                keys.add(step_variant(q_lens, [context + 1] * decodes + [context + chunk], dtype))
    return keys


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sweeps_request_only_warmed_up_variants(dtype) -> None:
    key_cache, value_cache = engine_caches(dtype)
    warmed = set(warmup_variants(key_cache, value_cache, N_Q, MAX_BATCHED_TOKENS))
    decode, mixed = decode_sweep(dtype), mixed_sweep(dtype)
    assert decode <= warmed and mixed <= warmed
    assert len(warmed) == 5  # small tile +- split, large tile one-block +- split, large tile with search
    assert len(decode) == 2  # a decode sweep of 1..256 requests, 1..8192 tokens: split or not


def test_warmup_set_does_not_grow_with_the_token_budget() -> None:
    small = attention_warmup_shapes(N_Q, N_KV, HEAD_DIM, 64)
    large = attention_warmup_shapes(N_Q, N_KV, HEAD_DIM, 8192)
    assert small == large


def test_split_count_is_not_a_compile_key() -> None:
    key_cache, value_cache = engine_caches(torch.float16)
    query = torch.empty(4, N_Q, HEAD_DIM, dtype=torch.float16, device=META)
    tables = torch.empty(4, 256, dtype=torch.int32, device=META)
    keys = {
        attention_variant_of(query, key_cache, value_cache, tables, 1, 4096, num_splits=s)
        for s in range(2, MAX_SPLITS + 1)
    }
    assert len(keys) == 1


def test_triton_specialises_ones_and_multiples_of_16() -> None:
    assert [int_specialization(v) for v in (1, 2, 16, 48, 17)] == ["1", "", "D", "D", ""]
