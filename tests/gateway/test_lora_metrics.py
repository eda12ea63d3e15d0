"""The engine's LoRA figures on /metrics (issue 43): vLLM's lora_requests_info, the adapter gauges, the
evictions counter and the load-time histogram, from one Stats; nothing without --enable-lora; and the
figures of several replicas merged (names united, buckets added)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import EngineCollector, GatewayMetrics, render
from gateway.replicas.router import combined_stats
from shared.protocol import Stats

BASE = Stats(1, 2, 0, 10, 20, 0, 5, 1, 0, 1, 1.0, 1)
BUCKETS = [0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3]  # cumulative: one read <= 10 ms, one <= 25 ms, one over 10 s


def with_lora(**changes: object) -> Stats:
    fields = {"max_loras": 4, "lora_running": ["sql"], "lora_waiting": ["chat", "poet"], "lora_loaded": 3,
              "lora_resident": 2, "lora_evictions": 5, "lora_load_buckets": BUCKETS, "lora_load_seconds": 12.5}
    return Stats(**{**BASE.__dict__, **fields, **changes})


def samples(stats: Stats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render(GatewayMetrics(), EngineCollector(lambda: (stats, "smollm2", True))).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_lora_figures_are_exported_under_vllm_and_pageserve_names() -> None:
    got = samples(with_lora())
    model = (("engine", "0"), ("model_name", "smollm2"))
    info = [k for k in got if k[0] == "vllm:lora_requests_info"]
    assert [dict(k[1]) for k in info] == [{"max_lora": "4", "running_lora_adapters": "sql",
                                           "waiting_lora_adapters": "chat,poet"}]
    assert got[("pageserve:lora_adapters_loaded", model)] == 3
    assert got[("pageserve:lora_adapters_resident", model)] == 2
    assert got[("pageserve:lora_adapters_active", model)] == 1
    assert got[("pageserve:lora_evictions_total", model)] == 5
    bucket = {dict(k[1])["le"]: v for k, v in got.items() if k[0] == "pageserve:lora_load_seconds_bucket"}
    assert (bucket["0.005"], bucket["0.01"], bucket["0.1"], bucket["10.0"], bucket["+Inf"]) == (0, 1, 2, 2, 3)
    assert (got[("pageserve:lora_load_seconds_count", model)], got[("pageserve:lora_load_seconds_sum", model)]) \
        == (3, 12.5)


def test_nothing_lora_without_enable_lora() -> None:
    assert not [name for name, _ in samples(BASE) if "lora" in name]


def test_replicas_figures_merge() -> None:
    merged = combined_stats([with_lora(), with_lora(lora_running=["poet"], lora_waiting=[], lora_load_buckets=[]), BASE])
    assert (merged.lora_running, merged.lora_waiting) == (["poet", "sql"], ["chat", "poet"])
    assert merged.lora_load_buckets == BUCKETS and merged.lora_evictions == 10 and merged.max_loras == 8
    assert (merged.num_running, merged.by_tenant) == (3, [])
