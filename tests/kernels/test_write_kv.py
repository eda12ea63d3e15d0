"""The Triton KV write against write_kv_ref: exact, padded slots untouched."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.checks import KernelArgError
from pageserve_kernels.reference import write_kv_ref
from pageserve_kernels.write_kv import write_kv


def caches(num_blocks: int, block_size: int, n_kv: int, hd: int, dtype: torch.dtype):
    k = torch.full((num_blocks, block_size, n_kv, hd), float("nan"), dtype=dtype)
    return k, k.clone()


@pytest.mark.parametrize(
    "num_tokens, n_kv, hd, block_size, src_dtype, cache_dtype",
    [
        (1, 1, 64, 16, torch.float32, torch.float32),
        (17, 3, 64, 16, torch.float32, torch.bfloat16),
        (15, 7, 128, 32, torch.float16, torch.float16),
        (33, 2, 80, 16, torch.bfloat16, torch.bfloat16),
    ],
)
def test_matches_reference_and_skips_padding(
    num_tokens, n_kv, hd, block_size, src_dtype, cache_dtype
) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    num_blocks = num_tokens // block_size + 4
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]  # out of order
    slots[torch.rand(num_tokens, generator=gen) < 0.25] = -1  # padded tokens
    slots[0] = -1
    # K and V as strided views of a fused (T, n_q + 2 n_kv, hd) projection
    qkv = torch.randn(num_tokens, 2 + 2 * n_kv, hd, generator=gen).to(src_dtype)
    key, value = qkv[:, 2 : 2 + n_kv], qkv[:, 2 + n_kv :]
    k_cache, v_cache = caches(num_blocks, block_size, n_kv, hd, cache_dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0, equal_nan=True)
    written = int((slots >= 0).sum()) * n_kv * hd
    assert int((~k_cache.isnan()).sum()) == written  # nothing else touched


def test_int32_slots_and_zero_tokens() -> None:
    k_cache, v_cache = caches(2, 16, 1, 16, torch.float32)
    key = torch.randn(3, 1, 16)
    write_kv(key, key * 2, k_cache, v_cache, torch.tensor([31, -1, 0], dtype=torch.int32))
    assert torch.equal(k_cache[1, 15, 0], key[0, 0]) and torch.equal(v_cache[0, 0, 0], 2 * key[2, 0])
    write_kv(key[:0], key[:0], k_cache, v_cache, torch.empty(0, dtype=torch.int64))


@pytest.mark.parametrize(
    "key_shape, slots, arg",
    [
        ((3, 2, 16), torch.zeros(3, dtype=torch.int64), "key"),  # n_kv 2 into a 1-head cache
        ((3, 1, 16), torch.zeros(4, dtype=torch.int64), "slot_mapping"),
        ((3, 1, 16), torch.zeros(3), "slot_mapping"),  # float slots
    ],
)
def test_bad_arguments(key_shape, slots, arg) -> None:
    k_cache, v_cache = caches(2, 16, 1, 16, torch.float32)
    key = torch.randn(key_shape)
    with pytest.raises(KernelArgError) as info:
        write_kv(key, key, k_cache, v_cache, slots)
    assert info.value.arg == arg
