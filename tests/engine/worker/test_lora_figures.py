"""The LoRA figures a Stats answer carries: running and waiting adapter names, residency, the load histogram."""

from __future__ import annotations

from dataclasses import dataclass

from engine.worker.lora.figures import lora_figures
from engine.worker.lora.registry import LoadTimes, LoraRegistry
from shared.protocol import LORA_LOAD_BUCKETS


@dataclass
class Req:
    lora_name: str


@dataclass
class Adapter:
    load_id: int


def test_load_times_are_a_fixed_histogram_with_prometheus_cumulative_counts() -> None:
    times = LoadTimes()
    for seconds in (0.004, 0.005, 0.08, 0.1, 60.0):  # a bound itself counts under it (Prometheus' le)
        times.observe(seconds)
    cumulative = times.cumulative()
    assert len(cumulative) == len(LORA_LOAD_BUCKETS) + 1
    by_bound = dict(zip(LORA_LOAD_BUCKETS, cumulative, strict=False))
    assert (by_bound[0.005], by_bound[0.05], by_bound[0.1], by_bound[10.0], cumulative[-1]) == (2, 2, 4, 4, 5)
    assert abs(times.total_seconds - 60.189) < 1e-9


def test_figures_name_running_and_waiting_adapters_once_and_count_the_registry() -> None:
    registry = LoraRegistry(lambda path, name, load_id: Adapter(load_id), max_cpu_loras=4)  # type: ignore[arg-type,return-value]
    for name in ("sql", "chat"):
        registry.load(name, f"/nowhere/{name}")
    registry.unload("chat")
    figures = lora_figures(registry, 2, [Req("sql"), Req(""), Req("sql")], [Req("chat"), Req("sql")])
    assert figures["lora_running"] == ["sql"] and figures["lora_waiting"] == ["chat", "sql"]
    assert (figures["max_loras"], figures["lora_loaded"], figures["lora_resident"]) == (2, 1, 2)
    assert figures["lora_load_buckets"][-1] == 2 and figures["lora_evictions"] == 0
