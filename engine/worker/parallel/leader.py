"""Rank 0's side of tensor parallelism: spawn the other ranks, join the group, send each step, shut down.

    TensorParallelLeader(config)   check the split, spawn ranks 1..N-1 (multiprocessing "spawn",
                                   daemonic: they die with rank 0), join the gloo group
    .shard(full model)             rank 0's ParallelLlama (the loader calls it before packing)
    .local_layout(layout)          rank 0's KV pool: every block, its own KV heads
    .ready()                       after rank 0 loaded: wait until every rank has
    .send_step(SchedulerOutput)    the runner's before_step hook: the same pickled StepMessage to every
                                   worker's pipe, before rank 0's own forward
    .close()                       tell the workers to stop, join them (terminate stragglers), leave the group,
                                   remove the rendezvous folder (also at exit; a killed engine's is swept
                                   by the next one: shared/owned_dirs.py)

Steps travel over pipes, not a gloo broadcast: a worker waits for the next step as long as the
engine idles (a collective would time out), and rank 0's death closes the pipes at once. The
scheduler and block manager run only here; this module knows nothing about them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
from multiprocessing.connection import Connection

import torch

from engine.config import EngineConfig
from engine.outputs import SchedulerOutput
from engine.step_failures import EngineStateLost
from engine.worker.kv_cache import CacheLayout
from engine.worker.models.architectures import read_spec
from engine.worker.models.decoder import DecoderModel
from engine.worker.parallel.group import RankGroup, threads_per_rank
from engine.worker.parallel.partition import check_tensor_parallel, plan_shards
from engine.worker.parallel.sharding import shard_model
from engine.worker.parallel.step_message import StepMessage
from engine.worker.parallel.worker import WorkerSpec, local_layout
from shared.model_store import resolve_model
from shared.owned_dirs import OwnedDir, sweep_stale

log = logging.getLogger("pageserve.engine")

JOIN_TIMEOUT_S = 10.0
RENDEZVOUS_PREFIX = "pageserve-tp-"


def spawn_worker(spec: WorkerSpec) -> tuple[subprocess.Popen[bytes], Connection]:
    """`python -m engine.worker.parallel.worker FD`: a fresh interpreter (no forked thread pools, no
    re-import of the caller's main module), the same import path, and the read end of a pipe whose
    first message is the spec (nothing of it on the command line)."""
    read_fd, write_fd = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "engine.worker.parallel.worker", str(read_fd)],
                                pass_fds=(read_fd,), env=env)
    finally:
        os.close(read_fd)  # the worker holds the only read end: rank 0's exit is its EOF
    pipe = Connection(write_fd, readable=False)
    pipe.send_bytes(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    return proc, pipe


class TensorParallelLeader:
    def __init__(self, config: EngineConfig) -> None:
        world = config.tensor_parallel_size
        shape = read_spec(resolve_model(config.model.model).config)
        check_tensor_parallel(shape, world, config.model.device)
        self.plan = plan_shards(shape, world, 0)
        threads = threads_per_rank(torch.get_num_threads(), world)
        torch.set_num_threads(threads)
        sweep_stale(RENDEZVOUS_PREFIX)  # a killed engine's folder: its owner is dead, no rank reads it
        self._dir = OwnedDir.create(RENDEZVOUS_PREFIX)
        store_path = str(self._dir.path / "rendezvous")
        self.workers: list[subprocess.Popen[bytes]] = []
        self._pipes: list[Connection] = []
        for rank in range(1, world):
            proc, pipe = spawn_worker(WorkerSpec(config, rank, store_path, threads))
            self.workers.append(proc)
            self._pipes.append(pipe)
        self._closed = False
        self.group: RankGroup | None = None
        atexit.register(self.close)
        log.info("tensor parallel: %d ranks, %d threads each; rank 0 holds KV heads %s, query heads %s",
                 world, threads, self.plan.kv_heads, self.plan.q_heads)
        try:
            self.group = RankGroup(store_path, 0, world)
        except BaseException:
            self.close()
            raise

    def shard(self, full: DecoderModel) -> DecoderModel:
        assert self.group is not None
        return shard_model(full, self.plan, self.group)

    def local_layout(self, layout: CacheLayout) -> CacheLayout:
        return local_layout(layout, self.plan)

    def ready(self) -> None:
        """Rank 0 has loaded: wait until every rank has (a rank that failed to start fails this)."""
        assert self.group is not None
        self.group.barrier()

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.workers]

    def send_step(self, out: SchedulerOutput) -> None:
        self._send(pickle.dumps(StepMessage.of(out), protocol=pickle.HIGHEST_PROTOCOL))

    def _send(self, data: bytes) -> None:
        try:
            for pipe in self._pipes:
                pipe.send_bytes(data)
        except OSError as e:  # BrokenPipeError: a worker died; its shard of every layer is gone
            raise EngineStateLost(f"a tensor-parallel worker is gone: {e}") from e

    def close(self) -> None:
        """Idempotent; also runs at exit."""
        if self._closed:
            return
        self._closed = True
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # a worker that is already gone needs no telling
                pipe.send_bytes(pickle.dumps(None))
            pipe.close()
        for proc in self.workers:
            try:
                proc.wait(JOIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel worker %d did not stop: killing it", proc.pid)
                proc.kill()
                proc.wait(JOIN_TIMEOUT_S)
        if self.group is not None:
            self.group.close()
        self._dir.remove()
        atexit.unregister(self.close)
