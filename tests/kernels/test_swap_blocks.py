"""Batched swaps between the device pool and the CPU pool, against swap_blocks_ref."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.checks import KernelArgError
from pageserve_kernels.reference import swap_blocks_ref
from pageserve_kernels.swap_blocks import swap_blocks


def pool(num_layers: int, num_blocks: int, device: str = "cpu", seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(num_blocks, 16, 2, 32, generator=gen).to(device) for _ in range(num_layers)]


def check_swap(src: list[torch.Tensor], dst: list[torch.Tensor], pairs: torch.Tensor) -> None:
    expected = [d.cpu().clone() for d in dst]
    for s, e in zip(src, expected, strict=True):
        swap_blocks_ref(s.cpu(), e, pairs)
    swap_blocks(src, dst, pairs)
    for d, e in zip(dst, expected, strict=True):
        assert torch.equal(d.cpu(), e)


def test_swap_out_and_back_in_on_one_device() -> None:
    device_pool, cpu_pool = pool(3, 10, seed=1), pool(3, 6, seed=2)
    out_pairs = torch.tensor([[7, 0], [2, 5], [9, 3]])
    check_swap(device_pool, cpu_pool, out_pairs)
    in_pairs = torch.tensor([[5, 1], [0, 4], [3, 8]])  # back to other device blocks
    check_swap(cpu_pool, device_pool, in_pairs)
    assert torch.equal(device_pool[1][1], device_pool[1][2])  # block 2 went out and came back as 1


def test_empty_and_bad_arguments() -> None:
    a, b = pool(2, 4), pool(2, 4)
    swap_blocks(a, b, torch.empty(0, 2, dtype=torch.int64))
    with pytest.raises(KernelArgError, match="dst_caches"):
        swap_blocks(a, b[:1], torch.tensor([[0, 1]]))
    with pytest.raises(KernelArgError, match="src_dst"):
        swap_blocks(a, b, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(KernelArgError, match="dst_caches\\[1\\]"):
        swap_blocks(a, [b[0], b[1].half()], torch.tensor([[0, 1]]))


@pytest.mark.gpu
def test_cross_device_swap_is_one_transfer_each_way() -> None:
    device_pool, cpu_pool = pool(4, 12, "cuda", seed=3), pool(4, 8, seed=4)
    check_swap(device_pool, cpu_pool, torch.tensor([[11, 0], [3, 7], [0, 2]]))
    check_swap(cpu_pool, device_pool, torch.tensor([[7, 1], [2, 5]]))
