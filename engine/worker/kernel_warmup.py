"""Start-up compilation of the Triton kernels, so that no step compiles while serving.

Runs once in EngineCore, after the KV cache exists (the binaries specialise on
its strides), for the Triton backend only; the torch backend compiles nothing.
The variants compiled are logged at start-up: pageserve_kernels/warmup.py explains why
that list is complete for every step the scheduler can build.
"""

from __future__ import annotations

import logging
import time

from engine.worker.kv_cache import KVCache
from pageserve_kernels.attention_launch import KernelVariant

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
