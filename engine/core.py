"""EngineCore: the synchronous step loop glue. Token ids in, token deltas out; no I/O.

    EngineCore(config)
      load weights (model_loader) -> size the KV cache from the budget (CacheLayout)
      -> Scheduler (pure Python) + ModelRunner (owns the device)

    step():  out = scheduler.schedule()          what runs, which blocks move
             result = runner.execute(out)        forward + sample
             return scheduler.update(out, result) deltas for the clients

The engine server (engine/serving/server.py) wraps this in the ZeroMQ process and the
offline `LLM` (engine/llm.py) drives it in a loop. Both see token ids only: the
core never imports a tokenizer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.outputs import RequestDelta
from engine.request import Request
from engine.scheduling.scheduler import Scheduler, SchedulerStats
from engine.serving.step_stats import CoreCounts
from engine.step_failures import RequestsFailed, is_fatal
from engine.worker import host_allocator
from engine.worker.decode_graphs import DecodeGraphs, bucket_sizes
from engine.worker.kernel_warmup import warm_up_lora, warm_up_triton
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.lora.adapter import LoraAdapter, load_adapter
from engine.worker.lora.errors import LoraError, LoraNotFound
from engine.worker.lora.evicted_reads import EvictedReads
from engine.worker.lora.figures import lora_figures
from engine.worker.lora.reader import LoraReader
from engine.worker.lora.registry import LoraRegistry
from engine.worker.model_loader import DTYPES, load_model, memory_reserve
from engine.worker.model_runner import ModelRunner
from engine.worker.models.spec import ModelSpec
from engine.worker.native_layers import NativeLayers
from engine.worker.sampler import Sampler
from engine.worker.sampling_defaults import resolve_sampling_defaults
from engine.worker.structured_outputs import StructuredOutputs
from pageserve_kernels.attention_launch import KernelVariant

if TYPE_CHECKING:
    from engine.worker.lora.warmup import LoraWarmup
    from engine.worker.parallel.leader import TensorParallelLeader
from pageserve_kernels.dispatch import select_backend
from shared.model_info import AdapterInfo, ModelInfo, SamplingDefault
from shared.protocol import TokenLogprob


def start_tensor_parallel(config: EngineConfig) -> TensorParallelLeader | None:
    """Spawn and join the other ranks (size > 1); the parallel code loads only then."""
    if config.tensor_parallel_size == 1:
        return None
    from engine.worker.parallel.leader import TensorParallelLeader

    return TensorParallelLeader(config)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.parallel = start_tensor_parallel(config)
        """Rank 0's handle on the other ranks (None at size 1: no process, no collective)."""
        try:
            self._build(config)
        except BaseException:
            self.close()
            raise

    def _build(self, config: EngineConfig) -> None:
        parallel = self.parallel
        loaded = load_model(config.model, shard=parallel.shard if parallel else None,
                            reserve_bytes=memory_reserve(config.cache), ranks=config.tensor_parallel_size)
        dtype = DTYPES[loaded.dtype]
        layout = CacheLayout.from_budget(config.cache, loaded.shape, dtype)
        # The context is the smallest of the model's positions, the model flag, and the scheduler's.
        limit = config.model.max_model_len or config.scheduler.max_model_len
        max_model_len = min(loaded.max_model_len, limit)
        self.scheduler = Scheduler(
            dataclasses.replace(config.scheduler, max_model_len=max_model_len),
            layout.num_device_blocks,
            layout.num_cpu_blocks,
            layout.block_size,
            vocab_size=loaded.shape.vocab_size,
        )
        backend = select_backend(config.attention_backend, config.model.device)  # the one choice
        self.kv_cache = KVCache(parallel.local_layout(layout) if parallel else layout, config.model.device,
                                backend.copy_blocks)
        self.structured = StructuredOutputs(loaded.path, loaded.shape.vocab_size, loaded.eos_token_id)
        self.runner = ModelRunner(loaded.model, self.kv_cache, Sampler(config.seed), backend, self.structured)
        if parallel is not None:
            parallel.ready()
            self.runner.before_step = parallel.send_step
        self.kernel_variants: list[KernelVariant] = []
        """The Triton variants compiled at start-up (empty on the torch backend)."""
        if backend.name == "triton":
            self.kernel_variants = warm_up_triton(
                self.kv_cache, loaded.shape.num_heads, min(config.scheduler.max_num_batched_tokens, max_model_len),
                loaded.shape.attention_kinds(),
            )
        if backend.name == "triton" and self.kv_cache.device_pool.device.type == "cuda" and not config.enforce_eager:
            graphs = DecodeGraphs(loaded.model, self.kv_cache.layers, self.runner.attention)
            graphs.capture(bucket_sizes(config.scheduler.max_num_seqs), max_model_len, layout.block_size)
            self.runner.fast_forward = graphs
        elif backend.name == "torch" and not config.enforce_eager:
            self.runner.fast_forward = NativeLayers.build(loaded.model, self.kv_cache.layers, self.runner.attention)
        self._set_up_lora(config, loaded.shape, dtype, min(config.scheduler.max_num_batched_tokens, max_model_len))
        defaults = resolve_sampling_defaults(loaded.path, loaded.name, config.default_sampling)
        self.model_info = ModelInfo(
            model_name=loaded.name,
            max_model_len=max_model_len,
            block_size=layout.block_size,
            eos_token_id=loaded.eos_token_id,
            num_blocks=layout.num_device_blocks,
            vocab_size=loaded.shape.vocab_size,
            default_sampling=tuple(SamplingDefault(k, v) for k, v in defaults.items()),
        )
        """The one record of the model's facts: the server checks and announces it, Ready carries it."""
        self._refresh_adapters()
        self.model_path: Path = loaded.path
        """The HF folder (`LLM` and the benchmarks load the tokenizer from it); engine-local, never sent."""
        self.dtype: str = loaded.dtype
        """The dtype it runs in ("auto" resolved)."""
        host_allocator.return_freed_memory()  # what loading freed, before the first step

    def _set_up_lora(self, config: EngineConfig, spec: ModelSpec, dtype: torch.dtype, max_step_tokens: int) -> None:
        self.loras = self._lora_registry(config, spec, dtype)
        """--enable-lora: the adapters served on the base model; None: requests may not name one."""
        self.runner.loras = self.loras
        self.lora_reader = LoraReader()
        """The one thread reading adapter folders off the loop: admin loads (engine/serving/lora_calls.py) and
        evicted adapters a request names (`evicted_reads`)."""
        self._empty_step = False  # the last step scheduled nothing (waits_only_on_reads)
        self.evicted_reads = EvictedReads(self.loras, self.lora_reader) if self.loras is not None else None
        self.lora_warmups: list[LoraWarmup] = []
        """The LoRA kernel launches compiled at start-up (--enable-lora on CUDA only: the Triton path)."""
        device = self.kv_cache.device_pool.device
        if self.loras is not None and device.type == "cuda":
            self.lora_warmups = warm_up_lora(spec, dtype, device, config.lora, max_step_tokens,
                                             config.scheduler.max_num_seqs)

    @staticmethod
    def _lora_registry(config: EngineConfig, spec: ModelSpec, dtype: torch.dtype) -> LoraRegistry | None:
        lora = config.lora
        if not lora.enabled:
            return None
        device = torch.device(config.model.device)
        registry = LoraRegistry(lambda path, name, load_id: load_adapter(
            path, name, spec, max_rank=lora.max_lora_rank, dtype=dtype, device=device, load_id=load_id),
            lora.max_cpu_loras)
        for name, path in lora.modules:
            registry.load(name, path)
            registry.sweep(())  # no request yet: past --max-cpu-loras, only the folder is kept
        return registry

    def load_lora(self, name: str, path: str) -> None:
        """Load (or reload under a new load id) an adapter; LoraError (a 400) on a bad one."""
        self.install_lora(name, path, self.read_lora(path, name, self.reserve_lora(name)), 0.0)

    def reserve_lora(self, name: str) -> int:
        """A new load id for `name` (on the step loop); then `read_lora` off it, `install_lora` on it."""
        if self.loras is None:
            raise LoraError("LoRA is not enabled on this engine (--enable-lora)")
        return self.loras.reserve(name)

    def read_lora(self, path: str, name: str, load_id: int) -> LoraAdapter:
        """Read, check and lay out the folder (LoraError naming the problem); safe on another thread."""
        assert self.loras is not None
        return self.loras.read(path, name, load_id)

    def install_lora(self, name: str, path: str, adapter: LoraAdapter, seconds: float) -> None:
        """On the step loop: the adapter serves new requests as `name` from now on (a reload retires the old load)."""
        assert self.loras is not None
        self.loras.install(name, path, adapter, seconds)
        self.loras.sweep(r.lora_id for r in self.scheduler.placement().live)  # --max-cpu-loras at once
        self._refresh_adapters()

    def unload_lora(self, name: str) -> None:
        """New requests no longer find `name`; those already admitted finish on its weights."""
        if self.loras is None:
            raise LoraNotFound(f"the adapter {name!r} is not loaded")
        self.loras.unload(name)
        self._refresh_adapters()

    def _refresh_adapters(self) -> None:
        names = self.loras.names() if self.loras is not None else []
        self.model_info = dataclasses.replace(self.model_info, adapters=tuple(
            AdapterInfo(name, self.model_info.model_name) for name in names))

    def close(self) -> None:
        """Stop the tensor-parallel workers (also done at exit) and the adapter reader."""
        if getattr(self, "lora_reader", None) is not None:
            self.lora_reader.close()
        if self.parallel is not None:
            self.parallel.close()

    def add_request(self, request: Request) -> None:
        """Queue a request (raises RequestRejected when it could never run)."""
        if request.eos_token_id is None:  # ignore_eos is honoured by the scheduler's stop rule
            request.eos_token_id = self.model_info.eos_token_id
        if request.grammar is not None:
            self.structured.check(request.grammar)
        if request.lora_name:  # resolved once: a later reload of the name never changes this request's weights
            if self.loras is None:
                raise LoraNotFound(f"the model {request.lora_name!r} does not exist")
            request.lora_id = self.loras.resolve(request.lora_name)
        self.scheduler.add_request(request)
        if request.lora_id and self.evicted_reads is not None and \
                self.evicted_reads.wait(request.lora_id, request.request_id):
            self.scheduler.loras.hold(request.lora_id)  # passed over, never blocking, until its weights are read

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        return self.scheduler.abort_requests(list(request_ids))

    def step(self) -> list[RequestDelta]:
        """One step; raises RequestsFailed (the step's requests aborted, the engine fine) when the
        forward, sampling or stop checks failed for reasons of those requests (engine/step_failures.py),
        or an evicted adapter they waited for could not be read again."""
        if self.evicted_reads is not None and self.evicted_reads.pending():
            self._finish_lora_reads()
        out = self.scheduler.schedule()
        self._empty_step = not out.chunks
        try:
            began = time.perf_counter()
            result = self.runner.execute(out)
            self.scheduler.step_costs.observe(out, time.perf_counter() - began)
            deltas = with_prompt_logprobs(self.scheduler.update(out, result), result.prompt_logprobs)
            if self.loras is not None and self.loras.needs_sweep():  # retired loads, weights over the cap
                self.loras.sweep(r.lora_id for r in self.scheduler.placement().live)
            return deltas
        except Exception as e:
            if is_fatal(e):
                raise
            failed = self.scheduler.fail_step(out)
            raise RequestsFailed(failed, f"the step failed: {type(e).__name__}: {e}") from e

    def waits_only_on_reads(self) -> bool:
        """The last step scheduled nothing while evicted adapters are read: the engine server may sleep until
        a read ends (the reader wakes it) or a message comes, instead of spinning on empty steps."""
        return self._empty_step and self.evicted_reads is not None and self.evicted_reads.pending()

    def _finish_lora_reads(self) -> None:
        """Evicted adapters read again become eligible; a failed read fails only the requests waiting on it."""
        assert self.evicted_reads is not None
        ready, failed = self.evicted_reads.finished()
        for load_id in ready + [f.load_id for f in failed]:
            self.scheduler.loras.release(load_id)
        if failed:
            ids = [rid for f in failed for rid in f.request_ids]
            self.scheduler.abort_requests(ids)
            raise RequestsFailed(ids, "; ".join(f.message for f in failed))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def has_unfinished_requests(self) -> bool:
        """Alias for the engine server's CoreLike protocol."""
        return self.scheduler.has_unfinished()

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def counts(self) -> CoreCounts:
        s = self.scheduler.stats()
        lora = {}
        if self.loras is not None:
            where = self.scheduler.placement()
            lora = lora_figures(self.loras, self.config.lora.max_loras, where.running, [*where.queued, *where.swapped])
        return CoreCounts(
            num_running=s.running,
            num_waiting=s.waiting,
            num_swapped=s.swapped,
            num_free_blocks=s.free_device_blocks,
            num_total_blocks=s.total_device_blocks,
            num_preemptions=s.preemptions,
            prefix_cache_queries=s.prefix_cache_query_tokens,
            prefix_cache_hits=s.prefix_cache_hit_tokens,
            num_swaps_out=s.swaps_out,
            num_recomputes=s.recomputes,
            num_free_cpu_blocks=s.free_cpu_blocks,
            num_total_cpu_blocks=s.total_cpu_blocks,
            **lora,
        )


def with_prompt_logprobs(deltas: list[RequestDelta], prompt: dict[str, list[TokenLogprob]]) -> list[RequestDelta]:
    """The runner's prompt logprobs on each request's delta of sample 0 (the prompt's last step samples it)."""
    if not prompt:
        return deltas
    return [dataclasses.replace(d, prompt_logprobs=prompt.pop(d.request_id)) if d.index == 0 and
            d.request_id in prompt else d for d in deltas]
