"""Copy-on-write block copies across all layers in one launch, against copy_blocks_ref."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.checks import KernelArgError
from pageserve_kernels.copy_blocks import copy_blocks
from pageserve_kernels.dispatch import copy_blocks_torch
from pageserve_kernels.reference import copy_blocks_ref


def layer_caches(num_caches: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen).to(dtype) for _ in range(num_caches)]


@pytest.mark.parametrize("impl", [copy_blocks, copy_blocks_torch], ids=["triton", "torch"])
@pytest.mark.parametrize(
    "num_caches, shape, dtype",
    [
        (4, (9, 16, 3, 64), torch.float32),  # 3072 elements a block: three chunks
        (2, (5, 32, 7, 128), torch.bfloat16),
        (1, (4, 16, 1, 80), torch.float16),  # 1280: a partial last chunk
    ],
)
def test_matches_reference(impl, num_caches, shape, dtype) -> None:
    caches = layer_caches(num_caches, shape, dtype)
    expected = [c.clone() for c in caches]
    pairs = torch.tensor([[3, 0], [1, 2], [3, shape[0] - 1]], dtype=torch.int64)
    impl(caches, pairs)
    copy_blocks_ref(expected, pairs)
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(caches[0][0], layer_caches(1, shape, dtype)[0][0])  # something moved


def test_no_pairs_is_a_no_op() -> None:
    caches = layer_caches(2, (3, 16, 1, 16), torch.float32)
    before = [c.clone() for c in caches]
    copy_blocks(caches, torch.empty(0, 2, dtype=torch.int64))
    assert all(torch.equal(a, b) for a, b in zip(caches, before, strict=True))


def test_mismatched_caches_are_refused() -> None:
    caches = layer_caches(2, (3, 16, 1, 16), torch.float32) + [torch.zeros(4, 16, 1, 16)]
    with pytest.raises(KernelArgError, match="caches\\[2\\]"):
        copy_blocks(caches, torch.tensor([[0, 1]]))
    with pytest.raises(KernelArgError, match="src_dst"):
        copy_blocks(caches[:1], torch.tensor([0, 1]))


def test_views_of_one_pool_tensor() -> None:
    """The engine keeps every layer's K and V in one (L, 2, N, block...) pool: copy through its views."""
    pool = torch.randn(3, 2, 6, 16, 2, 32)
    expected = pool.clone()
    pairs = torch.tensor([[5, 1], [0, 2]])
    copy_blocks([pool[layer, kv] for layer in range(3) for kv in range(2)], pairs)
    copy_blocks_ref([expected[layer, kv] for layer in range(3) for kv in range(2)], pairs)
    assert torch.equal(pool, expected)
    assert torch.equal(pool[2, 1, 1], pool[2, 1, 5])
