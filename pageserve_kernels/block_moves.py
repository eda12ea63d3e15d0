"""KV block moves, one interface: copy-on-write, swap out (device -> CPU pool), swap in (CPU -> device).

The engine calls one `BlockMover` per step, whatever the device; the two parts
that differ are chosen once, at start-up, by `select_block_mover`:

    copy-on-write   the attention backend's `copy_blocks`: pageserve_kernels/copy_blocks.py's
                    Triton kernel on the Triton backend, an index copy on the torch
                    one; so a fix to that kernel is what the engine runs
    swaps           `CudaStreams` when the device pool is on a GPU: a pinned CPU pool,
                    both swaps on a side stream, events guarding reused blocks;
                    `HostStreams` on the CPU engine: the same code, every wait a no-op
                    (one in-order host "stream")

Either way a swap is one batched transfer each way per step, over every layer.

Pools hold every layer, K and V: (num_layers, 2, num_blocks, block_size, n_kv, hd);
blocks are axis 2. Within a step the order is swap out, swap in, copies, and every
source is read before any destination is written, so a block freed by one move may
be the destination of another in the same step (engine/outputs.py, SchedulerOutput).

Streamed swaps, and what each event guards:

    side stream:  wait(compute)  gather out-blocks -> D2H into pinned staging  [copied]
                                 H2D pinned staging -> scatter in-blocks       [ready]
    compute:      wait(ready): this step's forward reads swapped-in blocks and may
                  overwrite swapped-out ones only after the side stream read them
    host:         next step: wait(copied), then scatter the staging into the CPU pool

The swap-out's device-to-host copy overlaps the step's forward; its CPU-side
scatter is deferred to the start of the next step (`begin_step`), so this step's
swap-in reads the CPU pool before any swap-out of the same step overwrites it.
This file knows nothing about requests or scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

Pairs = list[tuple[int, int]]
CopyBlocksFn = Callable[[list[torch.Tensor], torch.Tensor], None]
BLOCK_AXIS = 2


def layer_caches(pool: torch.Tensor) -> list[torch.Tensor]:
    """The K and V cache of every layer: contiguous views of the pool, each (num_blocks, block_size, n_kv, hd)."""
    return [pool[layer, kv] for layer in range(pool.shape[0]) for kv in range(2)]


def _index(pairs: Pairs, column: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([p[column] for p in pairs], dtype=torch.int64).to(device, non_blocking=True)


class Streams(Protocol):
    """The stream and event operations the streamed mover needs (CUDA's, or no-ops in tests)."""

    def on_side(self) -> AbstractContextManager[Any]: ...
    def side_waits_for_compute(self) -> None: ...
    def record_on_side(self) -> Any: ...
    def compute_waits(self, event: Any) -> None: ...
    def host_waits(self, event: Any) -> None: ...


class CudaStreams:
    def __init__(self, device: torch.device) -> None:
        self._side = torch.cuda.Stream(device)
        self._device = device

    def on_side(self) -> AbstractContextManager[Any]:
        return torch.cuda.stream(self._side)

    def side_waits_for_compute(self) -> None:
        self._side.wait_stream(torch.cuda.current_stream(self._device))

    def record_on_side(self) -> Any:
        event = torch.cuda.Event()
        event.record(self._side)
        return event

    def compute_waits(self, event: Any) -> None:
        torch.cuda.current_stream(self._device).wait_event(event)

    def host_waits(self, event: Any) -> None:
        event.synchronize()


class HostStreams:
    """One in-order host 'stream': every operation is done when issued, so waits are no-ops."""

    def on_side(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def side_waits_for_compute(self) -> None:
        pass

    def record_on_side(self) -> Any:
        return None

    def compute_waits(self, event: Any) -> None:
        pass

    def host_waits(self, event: Any) -> None:
        pass


@dataclass
class _PendingSwapOut:
    copied: Any  # event: the D2H copy into `staging` is complete
    staging: torch.Tensor  # (L, 2, N, block...) pinned host memory
    cpu_blocks: torch.Tensor  # (N,) int64 destinations in the CPU pool


class BlockMover:
    """Copy-on-write, swap out and swap in for one pair of pools (see the module docstring)."""

    def __init__(
        self, device_pool: torch.Tensor, cpu_pool: torch.Tensor, copy_blocks: CopyBlocksFn, streams: Streams
    ) -> None:
        self.device_pool, self.cpu_pool = device_pool, cpu_pool
        self._caches = layer_caches(device_pool)
        self._copy_blocks = copy_blocks
        self._streams = streams
        self._pending: list[_PendingSwapOut] = []
        self._pin = device_pool.device.type == "cuda"

    def begin_step(self) -> None:
        """Finish what earlier steps left in flight: their swap-outs' writes into the CPU pool."""
        for p in self._pending:
            self._streams.host_waits(p.copied)
            self.cpu_pool.index_copy_(BLOCK_AXIS, p.cpu_blocks, p.staging)
        self._pending.clear()

    def _staging(self, n: int) -> torch.Tensor:
        shape = (*self.cpu_pool.shape[:BLOCK_AXIS], n, *self.cpu_pool.shape[BLOCK_AXIS + 1 :])
        return torch.empty(shape, dtype=self.cpu_pool.dtype, pin_memory=self._pin)

    def swap_out(self, pairs: Pairs) -> None:
        """(device block, cpu block) pairs; the CPU pool is written at the next begin_step."""
        if not pairs:
            return
        staging = self._staging(len(pairs))
        with self._side_after_compute():
            gathered = self.device_pool.index_select(BLOCK_AXIS, _index(pairs, 0, self.device_pool.device))
            staging.copy_(gathered, non_blocking=self._pin)  # the one device -> host transfer
            copied = self._streams.record_on_side()
        self._streams.compute_waits(copied)  # the forward may reuse these device blocks afterwards
        self._pending.append(_PendingSwapOut(copied, staging, _index(pairs, 1, torch.device("cpu"))))

    def swap_in(self, pairs: Pairs) -> None:
        """(cpu block, device block) pairs."""
        if not pairs:
            return
        staging = self._staging(len(pairs))
        torch.index_select(self.cpu_pool, BLOCK_AXIS, _index(pairs, 0, torch.device("cpu")), out=staging)
        with self._side_after_compute():
            device = self.device_pool.device
            moved = staging.to(device, non_blocking=self._pin)  # the one host -> device transfer
            self.device_pool.index_copy_(BLOCK_AXIS, _index(pairs, 1, device), moved)
            ready = self._streams.record_on_side()
        self._streams.compute_waits(ready)

    def copy_on_write(self, pairs: Pairs) -> None:
        """(src, dst) device block pairs."""
        if pairs:  # on the compute stream, after the swaps (compute already waits for them)
            self._copy_blocks(self._caches, torch.tensor(pairs, dtype=torch.int64).to(self.device_pool.device))

    def synchronize(self) -> None:
        """Every move issued so far is complete and visible in both pools."""
        self.begin_step()

    @contextmanager
    def _side_after_compute(self) -> Iterator[None]:
        # Earlier steps' kernels may still read or write these blocks: the side stream starts after them.
        self._streams.side_waits_for_compute()
        with self._streams.on_side():
            yield


def select_block_mover(device_pool: torch.Tensor, cpu_pool: torch.Tensor, copy_blocks: CopyBlocksFn) -> BlockMover:
    """The block mover for these pools: side-stream swaps when the device pool is on a GPU."""
    cuda = device_pool.device.type == "cuda"
    streams: Streams = CudaStreams(device_pool.device) if cuda else HostStreams()
    return BlockMover(device_pool, cpu_pool, copy_blocks, streams)
