"""Prometheus metrics of the gateway and, through the Stats message, of the engine.

Two sources, one scrape (`GET /metrics`, `render`):

* Request metrics, observed in the worker that served the request:
  prometheus-client metrics in its multiprocess mode when PROMETHEUS_MULTIPROC_DIR
  is set (`gateway/server.py` sets and cleans it before any worker starts), so
  counters and histograms are summed over every uvicorn worker; in-process
  (unit tests) when it is not.
* Engine figures: the worker's latest `Stats` (polled by `EngineLink`), exposed by
  a collector at scrape time. Every worker sees the same engine, so whichever
  answers the scrape reports the engine's own totals, never a sum over workers.

Every series under vLLM's names exists from the first scrape, as vLLM's do (a
missing series reads "no data" on a dashboard, not 0): the request histograms
and counters get their model's children when the app starts (`prime`), and
until the engine's first Stats arrive its figures read 0 with
`pageserve:engine_stats_reported` 0 (then 1, and the last known values stay).

Names follow vLLM (vllm/v1/metrics/loggers.py) wherever vLLM has the figure, with
its types and its labels `model_name` and `engine`, so vLLM dashboards work
unchanged; our own figures are under `pageserve:` (the replica router's in
gateway/routing_metrics.py). Labels hold tenant names, replica addresses,
routes, statuses and kinds only: never a key, never prompt text.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from gateway.lora_metrics import lora_series
from gateway.routing_metrics import RoutingMetrics
from shared.protocol import Stats

ENGINE_INDEX = "0"
"""vLLM's `engine` label: we serve one engine."""
MODEL_LABELS = ["model_name", "engine"]

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
"""The three bucket lists vLLM uses for the same histograms (LATENCY_BUCKETS for e2e and queue time)."""
SUCCESS_REASONS = ("stop", "length")
"""The finished_reason labels vllm:request_success counts (gateway/request_context.py keeps only these)."""
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
ADMISSION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def clean_multiprocess_dir(path: str) -> None:
    """Remove the value files of an earlier run (stale counters would be summed into this one)."""
    os.makedirs(path, exist_ok=True)
    for f in glob.glob(os.path.join(path, "*.db")):
        os.remove(f)


def _forget_dead_workers(path: str) -> None:
    """A worker killed without a clean exit leaves its live gauges (active streams) behind: drop them."""
    for f in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        match = re.search(r"_(\d+)\.db$", f)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, path)
        except PermissionError:
            pass


@dataclass(frozen=True)
class RequestObservation:
    """What one finished HTTP request contributes (built by gateway/request_context.py)."""

    route: str
    status: int
    tenant: str
    model_name: str
    e2e_s: float
    ttft_s: float | None
    token_intervals_s: list[float]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reasons: list[str]
    admission_s: float | None
    refusal: str
    generated: bool
    """The request reached the engine (a generation), so the vLLM request histograms apply."""
    queue_s: float | None = None
    """The engine's queue time: from its arrival there to its first scheduling (None: never scheduled)."""


class GatewayMetrics:
    """The request metrics of one app; not registered globally (each scrape builds its registry)."""

    def __init__(self) -> None:
        r = None  # unregistered: a scrape collects them (in-process) or reads the shared files
        self.requests = Counter("pageserve:requests", "HTTP requests by tenant, route and status.",
                                ["tenant", "route", "status"], registry=r)
        self.request_seconds = Histogram("pageserve:request_duration_seconds", "HTTP request duration by route.",
                                         ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("pageserve:prompt_tokens", "Prompt tokens of served requests by tenant.",
                                     ["tenant"], registry=r)
        self.generation_tokens = Counter("pageserve:generation_tokens",
                                         "Generated tokens sent to clients by tenant.", ["tenant"], registry=r)
        self.cached_tokens = Counter("pageserve:cached_tokens", "Prompt tokens served from the prefix cache "
                                     "by tenant.", ["tenant"], registry=r)
        self.refusals = Counter("pageserve:rate_limit_refusals", "Requests refused by a quota, by limit kind.",
                                ["kind"], registry=r)
        self.active_streams = Gauge("pageserve:active_streams", "Generation requests in flight, streamed or whole (all workers).",
                                    multiprocess_mode="livesum", registry=r)
        self.admission_seconds = Histogram("pageserve:admission_seconds", "Key and quota admission latency "
                                           "(one Redis round trip).", buckets=ADMISSION_BUCKETS, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              MODEL_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in "
                              "seconds.", MODEL_LABELS, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             MODEL_LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                     MODEL_LABELS, buckets=TOKEN_BUCKETS, registry=r)
        self.generation_hist = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                         MODEL_LABELS, buckets=TOKEN_BUCKETS, registry=r)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING "
                                    "phase for request.", MODEL_LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.routing = RoutingMetrics()
        """The replica router's decisions (gateway/routing_metrics.py), fed by its counters."""
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*MODEL_LABELS, "finished_reason"], registry=r)

    def collectors(self) -> list[Collector]:
        return [self.requests, self.request_seconds, self.prompt_tokens, self.generation_tokens, self.cached_tokens,
                self.refusals, self.active_streams, self.admission_seconds, self.ttft, self.tpot, self.e2e,
                self.prompt_hist, self.generation_hist, self.queue_time, self.success, *self.routing.collectors()]

    def prime(self, model_name: str) -> None:
        """Create the model's children of every vLLM-named request metric, so each exports 0 before the
        first request (in multiprocess mode: written to this worker's files at once)."""
        model = (model_name, ENGINE_INDEX)
        for histogram in (self.ttft, self.tpot, self.e2e, self.prompt_hist, self.generation_hist, self.queue_time):
            histogram.labels(*model)
        for reason in SUCCESS_REASONS:
            self.success.labels(*model, reason)

    def observe(self, o: RequestObservation) -> None:
        self.requests.labels(o.tenant, o.route, str(o.status)).inc()
        self.request_seconds.labels(o.route).observe(o.e2e_s)
        if o.refusal:
            self.refusals.labels(o.refusal).inc()
        if o.admission_s is not None:
            self.admission_seconds.observe(o.admission_s)
        if not o.generated:
            return
        self.prompt_tokens.labels(o.tenant).inc(o.prompt_tokens)
        self.generation_tokens.labels(o.tenant).inc(o.completion_tokens)
        self.cached_tokens.labels(o.tenant).inc(o.cached_tokens)
        model = (o.model_name, ENGINE_INDEX)
        self.e2e.labels(*model).observe(o.e2e_s)
        self.prompt_hist.labels(*model).observe(o.prompt_tokens)
        self.generation_hist.labels(*model).observe(o.completion_tokens)
        if o.ttft_s is not None:
            self.ttft.labels(*model).observe(o.ttft_s)
        if o.queue_s is not None:
            self.queue_time.labels(*model).observe(o.queue_s)
        tpot = self.tpot.labels(*model)
        for interval in o.token_intervals_s:
            tpot.observe(interval)
        for reason in o.finish_reasons:
            self.success.labels(*model, reason).inc()


class EngineCollector(Collector):
    """The engine's figures from this worker's latest Stats, at scrape time."""

    def __init__(self, latest: Callable[[], tuple[Stats | None, str, bool]]) -> None:
        self._latest = latest
        """Returns (latest Stats or None, the engine's model name, engine healthy now)."""

    def collect(self) -> Iterator[Metric]:
        stats, model, healthy = self._latest()
        up = GaugeMetricFamily("pageserve:engine_up", "1 while the engine is connected and making progress.")
        up.add_metric([], 1.0 if healthy else 0.0)
        yield up
        reported = GaugeMetricFamily("pageserve:engine_stats_reported", "1 once the engine's statistics arrived "
                                     "(its series hold the last known values); 0 before: they read 0.")
        reported.add_metric([], 0.0 if stats is None else 1.0)
        yield reported
        yield from _engine_series(stats or NO_STATS, [model, ENGINE_INDEX])
        if stats is not None:  # a start time of 0 would read as an engine up since 1970
            g = GaugeMetricFamily("pageserve:engine_start_time_seconds", "Unix time the engine process started.",
                                  labels=MODEL_LABELS)
            g.add_metric([model, ENGINE_INDEX], stats.started_at)
            yield g


NO_STATS = Stats(num_running=0, num_waiting=0, num_swapped=0, num_free_blocks=0, num_total_blocks=0,
                 num_preemptions=0, num_steps=0, num_finished=0, num_aborted=0, max_requests_per_step=0,
                 mean_requests_per_step=0.0, num_gateways=0)
"""What the engine series read before the engine's first Stats: every figure 0."""


def _engine_series(s: Stats, labels: list[str]) -> Iterator[Metric]:
    """The engine's figures under vLLM's names where vLLM has them, ours under pageserve:."""

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=MODEL_LABELS)
        g.add_metric(labels, value)
        return g

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=MODEL_LABELS)
        c.add_metric(labels, value)
        return c

    usage = 1.0 - s.num_free_blocks / s.num_total_blocks if s.num_total_blocks else 0.0
    cpu = 1.0 - s.num_free_cpu_blocks / s.num_total_cpu_blocks if s.num_total_cpu_blocks else 0.0
    yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
    yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
    yield gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", s.num_swapped)
    yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
    yield gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache (swap) usage. 1 means 100 percent usage.", cpu)
    yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions)
    yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                  s.prefix_cache_queries)
    yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                  s.prefix_cache_hits)
    yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.num_prompt_tokens)
    yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.num_generation_tokens)
    yield counter("pageserve:engine_steps", "Engine steps since the engine started (its heartbeat).",
                  s.num_steps)
    yield counter("pageserve:preemption_swaps", "Preemptions whose KV went to the CPU swap pool.",
                  s.num_swaps_out)
    yield counter("pageserve:preemption_recomputes", "Preemptions whose KV was dropped and recomputed.",
                  s.num_recomputes)
    yield counter("pageserve:engine_aborted_requests", "Requests the engine aborted.", s.num_aborted)
    yield counter("pageserve:engine_step_seconds", "Time inside engine steps (model + scheduler).",
                  s.step_seconds)
    yield gauge("pageserve:engine_gateways", "Gateway processes connected to the engine.", s.num_gateways)
    yield from _loads(s, labels)
    yield from lora_series(s, labels)  # LoRA adapters: resident, active, loads, evictions (gateway/lora_metrics.py)


def _loads(s: Stats, labels: list[str]) -> Iterator[Metric]:
    """Our extras: queue lengths per priority, and each tenant's part of the engine (its fair share)."""
    queued = GaugeMetricFamily("pageserve:requests_queued", "Requests in the engine without a token yet, by "
                               "priority (lower is more urgent).", labels=[*MODEL_LABELS, "priority"])
    running = GaugeMetricFamily("pageserve:requests_generating", "Requests in the engine producing tokens, by "
                                "priority.", labels=[*MODEL_LABELS, "priority"])
    for p in s.by_priority:
        queued.add_metric([*labels, str(p.priority)], p.queued)
        running.add_metric([*labels, str(p.priority)], p.running)
    in_flight = GaugeMetricFamily("pageserve:tenant_requests_in_engine", "Requests in the engine by tenant id.",
                                  labels=[*MODEL_LABELS, "tenant_id"])
    tokens = CounterMetricFamily("pageserve:tenant_engine_generated_tokens", "Tokens the engine generated per "
                                 "tenant id since it started (divide by the sum for the fair share).",
                                 labels=[*MODEL_LABELS, "tenant_id"])
    for t in s.by_tenant:
        in_flight.add_metric([*labels, t.tenant_id], t.in_flight)
        tokens.add_metric([*labels, t.tenant_id], t.generated_tokens)
    yield from (queued, running, in_flight, tokens)


def render(metrics: GatewayMetrics, *at_scrape: Collector) -> bytes:
    """One scrape in Prometheus text format: every worker's request metrics plus the figures collected at
    scrape time (the engine's, the replicas')."""
    registry = CollectorRegistry(auto_describe=False)
    path = multiprocess_dir()
    if path is not None:
        _forget_dead_workers(path)
        MultiProcessCollector(registry, path=path)
    else:
        for c in metrics.collectors():
            registry.register(c)
    for collector in at_scrape:
        registry.register(collector)
    return generate_latest(registry)
