"""The C KV cache write (cpu_fused.NativeFused.store_kv) against index_copy_: exact, nothing else touched."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pageserve_kernels import cpu_attention, cpu_fused

native = cpu_fused.load()
needs_native = pytest.mark.skipif(native is None, reason="no C compiler here")


def caches(num_blocks: int, block_size: int, n_kv: int, hd: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    k = torch.full((num_blocks, block_size, n_kv, hd), float("nan"), dtype=dtype)
    return k, k.clone()


@needs_native
@pytest.mark.parametrize("dtype, tokens, n_kv, hd", [(torch.float32, 64, 3, 64), (torch.bfloat16, 17, 2, 80),
                                                     (torch.float16, 1, 8, 128)])
def test_matches_index_copy_from_slices_of_the_qkv_product(dtype: torch.dtype, tokens: int, n_kv: int,
                                                           hd: int) -> None:
    assert native is not None
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 3 + 2 * n_kv, hd, generator=gen).to(dtype)
    key, value = qkv[:, 3 : 3 + n_kv], qkv[:, 3 + n_kv :]  # rows strided, heads contiguous
    k_cache, v_cache = caches(tokens // 16 + 3, 16, n_kv, hd, dtype)
    slots = torch.randperm(k_cache.shape[0] * 16, generator=gen)[:tokens]
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k_ref.view(-1, n_kv, hd).index_copy_(0, slots, key)
    v_ref.view(-1, n_kv, hd).index_copy_(0, slots, value)
    assert native.store_kv(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0, equal_nan=True)
    assert int((~k_cache.isnan()).sum()) == tokens * n_kv * hd  # no other row written


@needs_native
@pytest.mark.parametrize("slot", [-1, 32])
def test_a_slot_outside_the_cache_raises(slot: int) -> None:
    assert native is not None
    k_cache, v_cache = caches(2, 16, 1, 16, torch.float32)
    key = torch.randn(2, 1, 16)
    with pytest.raises(IndexError, match="outside"):
        native.store_kv(key, key, k_cache, v_cache, torch.tensor([0, slot]))


@needs_native
def test_layouts_it_does_not_take_fall_back_to_torch() -> None:
    assert native is not None
    k_cache, v_cache = caches(2, 16, 2, 16, torch.float32)
    key = torch.randn(3, 16, 2).transpose(1, 2)  # heads not contiguous
    slots = torch.tensor([5, 0, 31])
    assert not native.store_kv(key, key, k_cache, v_cache, slots)
    assert not native.store_kv(key.contiguous(), key.contiguous(), k_cache, v_cache, slots.int())  # int32 slots
    assert int((~k_cache.isnan()).sum()) == 0  # nothing written on refusal
    cpu_attention.store_kv(key, key * 2, k_cache, v_cache, slots)
    assert torch.equal(k_cache[0, 5], key[0]) and torch.equal(v_cache[1, 15], 2 * key[2])


def test_the_attention_path_writes_through_the_c_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    class Recorder:
        def store_kv(self, *args: Any) -> bool:
            calls.append(args)
            return True

    monkeypatch.setattr(cpu_fused, "load", lambda: Recorder())
    k_cache, v_cache = caches(2, 16, 1, 16, torch.float32)
    key = torch.randn(2, 1, 16)
    cpu_attention.store_kv(key, key, k_cache, v_cache, torch.tensor([0, 1]))
    assert len(calls) == 1 and int((~k_cache.isnan()).sum()) == 0  # the C copy took it, torch wrote nothing
