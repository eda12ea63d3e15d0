"""`pageserve engine` flags -> the model engineer's EngineConfig -> a loaded EngineCore.

The one place where command-line values become frozen config objects (each
component gets its own part), and where the loaded core's derived facts become
the EngineInfo the server announces in Ready. Importing this module imports
torch; engine/serving/main.py imports it only inside main().
"""

from __future__ import annotations

import argparse

import torch

from engine.config import CacheConfig, EngineConfig, GiB, ModelConfig
from engine.core import EngineCore
from engine.scheduling.config import SchedulerConfig
from engine.serving.server import EngineInfo
from engine.worker.sampling_defaults import resolve_sampling_defaults


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """Raises ValueError (ConfigError) on out-of-range values, with the reason."""
    model = ModelConfig(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, device=args.device)
    cache = CacheConfig(
        block_size=args.block_size,
        kv_cache_memory=int(args.kv_cache_memory * GiB),
        swap_space=int(args.swap_space * GiB),
        num_device_blocks=args.num_blocks,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        policy=args.policy,
        preemption_mode=args.preemption_mode,
        preemption_priority_gap=args.preemption_priority_gap,
        aging_rate=args.aging_rate,
        max_prefill_tokens_while_decoding=args.max_prefill_while_decoding,
    )  # max_model_len: EngineCore derives the scheduler's from the model's and --max-model-len
    return EngineConfig(model=model, cache=cache, scheduler=scheduler, attention_backend=args.attention_backend,
                        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1))


def build_core(args: argparse.Namespace) -> tuple[EngineCore, EngineInfo]:
    if args.threads:
        torch.set_num_threads(args.threads)
    core = EngineCore(engine_config(args))
    m = core.model_info
    info = EngineInfo(
        model_name=m.name, max_model_len=m.max_model_len, block_size=m.block_size,
        eos_token_id=m.eos_token_id, num_blocks=m.num_device_blocks, vocab_size=m.vocab_size,
        default_sampling=resolve_sampling_defaults(m.path, m.name, getattr(args, "default_sampling", None)),
    )
    return core, info
