"""`pageserve engine` flags -> the model engineer's EngineConfig -> a loaded EngineCore.

The one place where command-line values become frozen config objects (each
component gets its own part). The loaded core's derived facts are its
`model_info` (shared/model_info.py), which the server sends in Ready. Importing this module imports
torch; engine/serving/main.py imports it only inside main().
"""

from __future__ import annotations

import argparse

import torch

from engine.config import CacheConfig, ConfigError, EngineConfig, GiB, LoraConfig, ModelConfig
from engine.core import EngineCore
from engine.scheduling.config import SchedulerConfig


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
        prefill_stall_factor=getattr(args, "prefill_stall_factor", 0.0),
        prefill_backlog_drain_s=getattr(args, "prefill_backlog_drain", 0.0),
        ttft_target_s=getattr(args, "ttft_target_ms", 0.0) / 1000,
        itl_target_s=getattr(args, "itl_target_ms", 0.0) / 1000,
        ttft_stall_limit=getattr(args, "ttft_stall_limit", SchedulerConfig.ttft_stall_limit),
        max_loras=getattr(args, "max_loras", 4),
    )  # max_model_len: EngineCore derives the scheduler's from the model's and --max-model-len
    return EngineConfig(model=model, cache=cache, scheduler=scheduler, attention_backend=args.attention_backend,
                        default_sampling=getattr(args, "default_sampling", None),
                        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1), lora=lora_config(args))


def lora_config(args: argparse.Namespace) -> LoraConfig:
    """--enable-lora and its limits; --lora-modules as NAME=PATH words (its environment twin: one string)."""
    words = getattr(args, "lora_modules", []) or []
    if isinstance(words, str):
        words = words.split()
    modules = []
    for word in words:
        name, sep, path = word.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--lora-modules takes NAME=PATH, not {word!r}")
        modules.append((name, path))
    return LoraConfig(enabled=getattr(args, "enable_lora", False), modules=tuple(modules),
                      max_loras=getattr(args, "max_loras", 4), max_lora_rank=getattr(args, "max_lora_rank", 64),
                      max_cpu_loras=getattr(args, "max_cpu_loras", 32))


def build_core(args: argparse.Namespace) -> EngineCore:
    """Raises ValueError on a bad configuration (SamplingDefaultsError for --default-sampling)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return EngineCore(engine_config(args))
