"""A tensor-parallel worker process (rank >= 1): load its shard, then run every step rank 0 sends, forever.

    spawn (by rank 0) -> set threads -> join the gloo group -> load the full model, keep its shard
    -> its KV pool (its KV heads only, rank 0's block count) -> loop:
         recv StepMessage (a pipe from rank 0) -> block moves -> forward (all_reduces) -> logits (gather)

The worker never samples and never sees text. It exits when rank 0 says so (None), when the
pipe closes (rank 0 ended, or died: the kernel closes its end), when a collective fails, or
(while it is still starting) when it sees it has a new parent.
A step that fails here the same way as on rank 0 (bad inputs) is logged and the loop goes on.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import torch

from engine.config import EngineConfig
from engine.outputs import SchedulerOutput
from engine.step_failures import EngineStateLost
from engine.worker.input_batch import build_step_inputs, order_chunks
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.model_loader import DTYPES, load_model, memory_reserve
from engine.worker.model_runner import ModelRunner
from engine.worker.models.architectures import read_spec
from engine.worker.parallel.group import RankGroup
from engine.worker.parallel.partition import ShardPlan, plan_shards
from engine.worker.parallel.sharding import shard_model
from engine.worker.parallel.step_message import StepMessage
from engine.worker.sampler import Sampler
from pageserve_kernels.dispatch import select_backend
from shared.model_store import resolve_model

log = logging.getLogger("pageserve.engine.tp")


@dataclass(frozen=True)
class WorkerSpec:
    config: EngineConfig
    rank: int
    store_path: str
    """The gloo group's rendezvous file (engine/worker/parallel/group.py)."""
    threads: int


def build_rank_runner(config: EngineConfig, plan: ShardPlan, group: RankGroup) -> ModelRunner:
    """This rank's shard, KV pool and runner (rank 0's EngineCore builds its own the same way)."""
    loaded = load_model(config.model, shard=lambda full: shard_model(full, plan, group),
                        reserve_bytes=memory_reserve(config.cache), ranks=config.tensor_parallel_size)
    layout = local_layout(CacheLayout.from_budget(config.cache, loaded.shape, DTYPES[loaded.dtype]), plan)
    backend = select_backend(config.attention_backend, config.model.device)
    kv_cache = KVCache(layout, config.model.device, backend.copy_blocks)
    return ModelRunner(loaded.model, kv_cache, Sampler(config.seed), backend)


def local_layout(layout: CacheLayout, plan: ShardPlan) -> CacheLayout:
    """Every rank has the same blocks (the scheduler's ids), each holding only this rank's KV heads."""
    return replace(layout, num_kv_heads=plan.num_kv_heads)


def run_step(runner: ModelRunner, out: SchedulerOutput) -> None:
    """Rank 0's ModelRunner.execute up to the logits, whose slice goes to rank 0 (engine/worker/parallel/layers.py)."""
    runner.kv_cache.move_blocks(out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy)
    if not out.chunks:
        return
    with torch.inference_mode():
        inputs = build_step_inputs(order_chunks(out.chunks), runner.block_size, runner.device, runner.attention)
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta,
                              runner.attention)
        if inputs.has_logits:
            runner.model.compute_logits(hidden[inputs.logits_indices])


def serve_steps(runner: ModelRunner, conn: Connection) -> None:
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            log.info("rank 0 is gone: worker exits")
            return
        message: StepMessage | None = pickle.loads(data)
        if message is None:
            return
        try:
            run_step(runner, message.scheduler_output())
        except EngineStateLost:
            raise
        except Exception:  # rank 0 fails the same step the same way; its requests are failed there
            log.exception("tensor-parallel step failed on this rank")


def exit_with_parent(poll_s: float = 0.5) -> None:
    """Exit as soon as rank 0 is gone, even while still joining or loading (the pipe is read only
    between steps): a worker is never left behind."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def worker_main(conn: Connection) -> None:
    """The process: the spec is the pipe's first message."""
    exit_with_parent()
    spec: WorkerSpec = pickle.loads(conn.recv_bytes())
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s tp-rank{spec.rank}: %(message)s")
    torch.set_num_threads(spec.threads)
    world = spec.config.tensor_parallel_size
    group = RankGroup(spec.store_path, spec.rank, world)
    try:
        shape = read_spec(resolve_model(spec.config.model.model).config)
        runner = build_rank_runner(spec.config, plan_shards(shape, world, spec.rank), group)
        group.barrier()  # loaded: rank 0 starts serving once every rank has
        serve_steps(runner, conn)
    finally:
        conn.close()
        group.close()


if __name__ == "__main__":
    worker_main(Connection(int(sys.argv[1]), writable=False))
