"""The gloo group of the tensor-parallel ranks, on loopback, and each rank's share of the cores.

A standalone `ProcessGroupGloo` (not torch.distributed's process-wide default group), so one
process may hold several engines (tests compare size 1 and size 2 side by side, and start
engines one after another). Rendezvous through a `FileStore` in a fresh temporary folder (no
port to pick and race for); gloo's connections are bound to the loopback interface, so no
rank listens beyond 127.0.0.1. A failed collective means a peer is gone: EngineStateLost.
Knows nothing about models or steps.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroupGloo

from engine.step_failures import EngineStateLost

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
"""A collective that waits this long means a rank hangs; a rank that died fails its peers at once."""


def threads_per_rank(total_threads: int, world_size: int) -> int:
    """Each rank gets an equal share of the threads, so N ranks do not oversubscribe the cores."""
    return max(1, total_threads // world_size)


class RankGroup:
    """This rank's handle on the group: the three collectives the forward needs, and a barrier."""

    def __init__(self, store_path: str, rank: int, world_size: int) -> None:
        """Blocks until every rank has joined."""
        self.rank, self.world_size = rank, world_size
        options = ProcessGroupGloo._Options()
        options._timeout = COLLECTIVE_TIMEOUT
        options._devices = [ProcessGroupGloo.create_device(interface="lo")]
        self._pg = ProcessGroupGloo(dist.FileStore(store_path, world_size), rank, world_size, options)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        self._wait("all_reduce", lambda: self._pg.allreduce([x]))
        return x

    def gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `x` (equal shapes) on rank 0, in rank order; None on the others."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == 0 else None
        options = dist.GatherOptions()
        options.rootRank = 0
        self._wait("gather", lambda: self._pg.gather([parts] if parts else [], [x.contiguous()], options))
        return parts

    def barrier(self) -> None:
        self._wait("barrier", self._pg.barrier)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._pg.shutdown()

    @staticmethod
    def _wait(name: str, start) -> None:  # type: ignore[no-untyped-def]
        try:
            start().wait()
        except RuntimeError as e:  # gloo: a peer closed its connection, or the timeout passed
            raise EngineStateLost(f"tensor-parallel {name} failed (a rank is gone?): {e}") from e
