"""The engine's LoRA figures on /metrics, from its latest Stats (issue 43), beside gateway/metrics.py's.

    vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}   vLLM's own series:
        the adapters of running and waiting requests, comma-joined (its value: the scrape's Unix time)
    pageserve:lora_adapters_loaded / _resident / _active   names requests may use / loads whose weights
        are in memory / adapters with running requests
    pageserve:lora_evictions_total     adapter weights dropped over --max-cpu-loras (read again on use)
    pageserve:lora_load_seconds        histogram of reading an adapter from disk (loads and re-reads)

Per-adapter requests and tokens are the request metrics with the adapter's name as `model_name`
(vllm:request_success_total, vllm:request_prompt_tokens_sum, vllm:request_generation_tokens_sum):
gateway/request_context.py labels each request with the model its response names. Nothing is exported
while the engine runs without --enable-lora (Stats.max_loras 0), as vLLM exports nothing then.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from shared.protocol import LORA_LOAD_BUCKETS, Stats

MODEL_LABELS = ["model_name", "engine"]


def lora_series(s: Stats, labels: list[str]) -> Iterator[Metric]:
    """`labels`: the model_name and engine values of gateway/metrics.py's engine series."""
    if not s.max_loras:
        return
    info = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                             labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    info.add_metric([str(s.max_loras), ",".join(s.lora_running), ",".join(s.lora_waiting)], time.time())
    yield info
    for name, doc, value in (
        ("pageserve:lora_adapters_loaded", "LoRA adapters requests may name.", s.lora_loaded),
        ("pageserve:lora_adapters_resident", "LoRA adapter loads whose weights are in memory.", s.lora_resident),
        ("pageserve:lora_adapters_active", "LoRA adapters with running requests.", len(s.lora_running)),
    ):
        g = GaugeMetricFamily(name, doc, labels=MODEL_LABELS)
        g.add_metric(labels, value)
        yield g
    evictions = CounterMetricFamily("pageserve:lora_evictions", "LoRA adapter weights dropped from memory over "
                                    "--max-cpu-loras (read from disk again on next use).", labels=MODEL_LABELS)
    evictions.add_metric(labels, s.lora_evictions)
    yield evictions
    yield _load_histogram(s, labels)


def _load_histogram(s: Stats, labels: list[str]) -> HistogramMetricFamily:
    h = HistogramMetricFamily("pageserve:lora_load_seconds", "Seconds to read, check and lay out a LoRA adapter "
                              "from disk (off the engine's step loop).", labels=MODEL_LABELS)
    counts = s.lora_load_buckets or [0] * (len(LORA_LOAD_BUCKETS) + 1)
    bounds = [*(repr(float(b)) for b in LORA_LOAD_BUCKETS), "+Inf"]
    h.add_metric(labels, list(zip(bounds, counts, strict=False)), s.lora_load_seconds)
    return h
