"""The LoRA figures of one Stats answer: which adapters run and wait, what is resident, how loads went.

    running requests' adapters ─┐
    queued + swapped ones      ─┼─> names (vllm:lora_requests_info's running/waiting_lora_adapters)
    the registry               ─┴─> loaded names, resident loads, evictions, the load-time histogram

Field names are CoreCounts' (engine/serving/step_stats.py), which are Stats' (shared/protocol.py).
Pure Python over the requests' adapter names: no torch, no scheduling logic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from engine.worker.lora.registry import LoraRegistry


class HasAdapter(Protocol):
    lora_name: str


def lora_figures(registry: LoraRegistry, max_loras: int, running: Iterable[HasAdapter],
                 waiting: Iterable[HasAdapter]) -> dict[str, Any]:
    """CoreCounts' LoRA fields; adapter names sorted, each once."""
    return {
        "max_loras": max_loras,
        "lora_running": sorted({r.lora_name for r in running if r.lora_name}),
        "lora_waiting": sorted({r.lora_name for r in waiting if r.lora_name}),
        "lora_loaded": registry.num_loaded,  # O(1): a Stats answer never walks the registry
        "lora_resident": registry.num_resident,
        "lora_evictions": registry.evictions,
        "lora_load_buckets": registry.load_times.cumulative(),
        "lora_load_seconds": registry.load_times.total_seconds,
    }
