"""The torch.distributed gloo group of the tensor-parallel ranks, on loopback, and each rank's share of the cores.

Rendezvous through a file (`file://` in a fresh temporary folder: no port to pick and race for);
gloo's own connections are pinned to the loopback interface (GLOO_SOCKET_IFNAME=lo) so no rank
listens beyond 127.0.0.1. Knows nothing about models or steps.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
"""A collective that waits this long means a rank hangs; a rank that died fails its peers at once."""


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_rank(total_threads: int, world_size: int) -> int:
    """Each rank gets an equal share of the threads, so N ranks do not oversubscribe the cores."""
    return max(1, total_threads // world_size)


def join_group(init_method: str, rank: int, world_size: int) -> None:
    """Blocks until every rank has joined."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)


def ready_barrier() -> None:
    """Every rank has loaded its shard (a rank that failed to start fails this on the others)."""
    dist.barrier()


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
