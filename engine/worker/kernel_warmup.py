"""Start-up compilation of the Triton kernels, so that no step compiles while serving.

Runs once in EngineCore, after the KV cache exists (the binaries specialise on
its strides), for the Triton backend only; the torch backend compiles nothing.
The variants compiled are logged at start-up: pageserve_kernels/warmup.py explains why
that list is complete for every step the scheduler can build. With --enable-lora on CUDA
the LoRA shrink/expand kernels are compiled too (engine/worker/lora/warmup.py says why
its list is complete), so an engine's first adapter step compiles nothing either.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from engine.config import LoraConfig
from engine.worker.kv_cache import KVCache
from engine.worker.models.spec import ModelSpec
from pageserve_kernels.attention_launch import KernelVariant

if TYPE_CHECKING:
    from engine.worker.lora.warmup import LoraWarmup

log = logging.getLogger("pageserve.engine")


def warm_up_triton(kv_cache: KVCache, num_heads: int, max_num_batched_tokens: int,
                   kinds: tuple[tuple[int, float], ...] = ((0, 0.0),)) -> list[KernelVariant]:
    """Compile (launch once) every kernel variant; returns the paged-attention ones, also logged.
    `kinds`: the (window, softcap) pairs the model's layers attend with (ModelSpec.attention_kinds)."""
    from pageserve_kernels.warmup import warm_up_kernels  # Triton loads only for the Triton backend

    start = time.perf_counter()
    key_cache, value_cache = kv_cache.layers[0]
    variants = warm_up_kernels(key_cache, value_cache, num_heads, max_num_batched_tokens, kinds)
    log.info("triton warm-up: %d paged-attention variants (+ merge_splits, write_kv, copy_blocks) in %.1f s",
             len(variants), time.perf_counter() - start)
    for v in variants:
        log.info("  %s", v.describe())
    return variants


def warm_up_lora(spec: ModelSpec, dtype: torch.dtype, device: torch.device, lora: LoraConfig,
                 max_num_batched_tokens: int, max_num_seqs: int) -> list[LoraWarmup]:
    """Compile every LoRA kernel variant a CUDA step of this engine can launch; returns the launches, logged."""
    from engine.worker.lora.warmup import lora_warmup_plan, run_lora_warmup  # Triton loads only here

    start = time.perf_counter()
    plan = lora_warmup_plan(spec, lora.max_lora_rank, lora.max_loras, max_num_batched_tokens, max_num_seqs)
    run_lora_warmup(spec, plan, dtype, device)
    log.info("triton warm-up: %d LoRA shrink/expand launches in %.1f s", len(plan), time.perf_counter() - start)
    for w in plan:
        log.debug("  %s", w.describe())
    return plan
