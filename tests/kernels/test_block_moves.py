"""pageserve_kernels/block_moves.py: the one path for copy-on-write and swaps, its results and its stream ordering.

On the CPU the CUDA streams and events are replaced by a recorder that logs the
order of operations (as CUDA would see them) and checks, at every pool access,
that the guarding waits came first.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from pageserve_kernels.block_moves import BlockMover, HostStreams, layer_caches, select_block_mover
from pageserve_kernels.copy_blocks import copy_blocks
from pageserve_kernels.dispatch import copy_blocks_torch

LAYERS, BLOCK = 3, (2, 2, 4)  # block_size, n_kv, hd


def pools(device_blocks: int = 8, cpu_blocks: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(LAYERS, 2, device_blocks, *BLOCK, generator=gen),
            torch.randn(LAYERS, 2, cpu_blocks, *BLOCK, generator=gen))


def reference_step(dev: torch.Tensor, cpu: torch.Tensor, out: list, inn: list, copy: list) -> None:
    """Read every source first, then write: the contract of a step's moves."""
    out_data = [dev[:, :, s].clone() for s, _ in out]
    in_data = [cpu[:, :, s].clone() for s, _ in inn]
    for (_, d), x in zip(out, out_data, strict=True):
        cpu[:, :, d] = x
    for (_, d), x in zip(inn, in_data, strict=True):
        dev[:, :, d] = x
    copy_data = [dev[:, :, s].clone() for s, _ in copy]
    for (_, d), x in zip(copy, copy_data, strict=True):
        dev[:, :, d] = x


def random_step(rng: random.Random, n_dev: int, n_cpu: int) -> tuple[list, list, list]:
    dev, cpu = rng.sample(range(n_dev), 6), rng.sample(range(n_cpu), 4)
    out = [(dev[0], cpu[0]), (dev[1], cpu[1])][: rng.randint(0, 2)]
    inn = [(cpu[2], dev[2]), (cpu[0], dev[0])][: rng.randint(0, 2)]  # may reuse blocks swapped out
    copy = [(dev[3], dev[4])][: rng.randint(0, 1)]
    return out, inn, copy


@pytest.mark.parametrize("copy_fn", [copy_blocks_torch, copy_blocks], ids=["torch", "triton"])
def test_random_steps_match_the_reference(copy_fn) -> None:
    dev, cpu = pools()
    mover = BlockMover(dev, cpu, copy_fn, HostStreams())
    ref_dev, ref_cpu = dev.clone(), cpu.clone()
    rng = random.Random(0)
    for _ in range(12):
        out, inn, copy = random_step(rng, 8, 6)
        mover.begin_step()
        mover.swap_out(out)
        mover.swap_in(inn)
        mover.copy_on_write(copy)
        reference_step(ref_dev, ref_cpu, out, inn, copy)
        assert torch.equal(dev, ref_dev)
    mover.synchronize()
    assert torch.equal(cpu, ref_cpu)


def test_cpu_engine_gets_host_streams_and_the_backend_copy() -> None:
    dev, cpu = pools()
    mover = select_block_mover(dev, cpu, copy_blocks)
    assert isinstance(mover._streams, HostStreams) and mover._copy_blocks is copy_blocks
    assert [c.data_ptr() for c in layer_caches(dev)] == [dev[i, kv].data_ptr() for i in range(3) for kv in range(2)]


class RecordingStreams:
    """CUDA's semantics, logged: an op on the side stream must follow side_waits_for_compute."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.side_ready = False
        self.on = "compute"
        self.events = 0

    @contextmanager
    def on_side(self) -> Any:
        assert self.side_ready, "side stream used before it waited for the compute stream"
        self.on = "side"
        self.log.append("side{")
        yield
        self.log.append("}")
        self.on, self.side_ready = "compute", False

    def side_waits_for_compute(self) -> None:
        self.side_ready = True
        self.log.append("side waits compute")

    def record_on_side(self) -> Any:
        assert self.on == "side"
        self.events += 1
        self.log.append(f"record e{self.events}")
        return f"e{self.events}"

    def compute_waits(self, event: Any) -> None:
        self.log.append(f"compute waits {event}")

    def host_waits(self, event: Any) -> None:
        self.log.append(f"host waits {event}")


def test_stream_order_of_a_step_with_both_swaps() -> None:
    dev, cpu = pools()
    streams = RecordingStreams()
    mover = BlockMover(dev, cpu, copy_blocks_torch, streams)
    before = cpu.clone()
    mover.begin_step()
    mover.swap_out([(5, 1)])
    mover.swap_in([(1, 5)])  # the CPU block the swap-out targets, the device block it frees
    mover.copy_on_write([(0, 7)])
    assert streams.log == [
        "side waits compute", "side{", "record e1", "}", "compute waits e1",  # swap-out gathered and sent
        "side waits compute", "side{", "record e2", "}", "compute waits e2",  # swap-in landed
    ]
    # The swap-in read the CPU block before the swap-out's data was written into it.
    assert torch.equal(dev[:, :, 5], before[:, :, 1])
    assert torch.equal(cpu, before)  # the swap-out is still in flight: written at the next step
    mover.begin_step()
    assert streams.log[-1] == "host waits e1"
    assert not torch.equal(cpu[:, :, 1], before[:, :, 1])


def test_no_waits_for_an_empty_step() -> None:
    dev, cpu = pools()
    streams = RecordingStreams()
    mover = BlockMover(dev, cpu, copy_blocks_torch, streams)
    mover.begin_step()
    mover.swap_out([])
    mover.swap_in([])
    mover.copy_on_write([])
    assert streams.log == []


@pytest.mark.gpu
def test_cuda_mover_pins_the_pool_and_matches_the_reference() -> None:
    from pageserve_kernels.block_moves import CudaStreams

    dev, cpu = pools()
    dev, cpu = dev.cuda(), cpu.pin_memory()
    mover = select_block_mover(dev, cpu, copy_blocks)
    assert isinstance(mover._streams, CudaStreams) and cpu.is_pinned()
    ref_dev, ref_cpu = dev.cpu(), cpu.clone()
    rng = random.Random(1)
    for _ in range(12):
        out, inn, copy = random_step(rng, 8, 6)
        mover.begin_step()
        mover.swap_out(out)
        mover.swap_in(inn)
        mover.copy_on_write(copy)
        dev.add_(0.0)  # a compute-stream op after the moves: ordered behind them by the events
        reference_step(ref_dev, ref_cpu, out, inn, copy)
    mover.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), ref_dev) and torch.equal(cpu, ref_cpu)
