"""The replica router's decisions and each replica's load on /metrics, under `pageserve:`.

    pageserve:router_decisions_total{replica, reason}   requests routed (reason: affinity, overflow, load)
    pageserve:router_retries_total                      moved to another replica before their first token
    pageserve:router_failovers_exhausted_total          no token yet, but no other live replica: a 503
    pageserve:router_requests_cut_total                 had sent tokens when their replica was lost
    pageserve:replica_evictions_total{reason}           replicas dropped from the live set (dead, stalled, withdrawn)
    pageserve:live_replicas, pageserve:replica_requests_waiting{replica},
    pageserve:replica_requests_running{replica}, pageserve:replica_kv_cache_usage_perc{replica}

The counters are prometheus-client counters fed by the router's own counting
(gateway/replicas/counters.py tells `RoutingMetrics` each event), so the
multiprocess mode sums them over workers like every request metric. The gauges
are this worker's view of the live set at scrape time (every worker routes over
the same engines). `replica` is the engine's address; nothing here names a tenant.
With the single engine link (no --engine list, no discovery) the counters stay 0
and there are no replica gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.replicas.counters import RoutingEvent
from gateway.replicas.policy import ReplicaLoad, RouteReason


class RoutingMetrics:
    """The router's events as counters; implements gateway/replicas/counters.py's RoutingObserver."""

    def __init__(self) -> None:
        r = None  # unregistered, as GatewayMetrics' own (a scrape collects them)
        self.decisions = Counter("pageserve:router_decisions", "Requests routed to a replica, by reason "
                                 "(affinity: the prefix's replica; overflow: it was overloaded; load: no full "
                                 "block to share).", ["replica", "reason"], registry=r)
        self.retries = Counter("pageserve:router_retries", "Requests moved to another replica because theirs "
                               "was lost before their first token.", registry=r)
        self.exhausted = Counter("pageserve:router_failovers_exhausted", "Requests with no token yet whose "
                                 "replica was lost and no other live replica was left.", registry=r)
        self.cut = Counter("pageserve:router_requests_cut", "Requests that had sent tokens when their replica "
                           "was lost (they ended with an error).", registry=r)
        self.evictions = Counter("pageserve:replica_evictions", "Replicas dropped from the live set, by reason.",
                                 ["reason"], registry=r)
        self._events: dict[RoutingEvent, Counter] = {
            "retry": self.retries, "failover_exhausted": self.exhausted, "cut_by_replica_loss": self.cut}

    def collectors(self) -> list[Collector]:
        return [self.decisions, self.retries, self.exhausted, self.cut, self.evictions]

    def routed(self, replica_id: str, reason: RouteReason) -> None:
        self.decisions.labels(replica_id, reason).inc()

    def event(self, kind: RoutingEvent) -> None:
        self._events[kind].inc()

    def evicted(self, reason: str) -> None:
        self.evictions.labels(reason).inc()


class ReplicaCollector(Collector):
    """Each live replica's load as the router sees it, at scrape time (nothing without replicas)."""

    def __init__(self, loads: Callable[[], list[ReplicaLoad] | None]) -> None:
        self._loads = loads

    def collect(self) -> Iterator[Metric]:
        loads = self._loads()
        if loads is None:
            return
        live = GaugeMetricFamily("pageserve:live_replicas", "Engine replicas in this gateway's live set.")
        live.add_metric([], len(loads))
        waiting = GaugeMetricFamily("pageserve:replica_requests_waiting", "Requests waiting in a replica "
                                    "(its last stats plus those sent since).", labels=["replica"])
        running = GaugeMetricFamily("pageserve:replica_requests_running", "Requests running in a replica.",
                                    labels=["replica"])
        kv = GaugeMetricFamily("pageserve:replica_kv_cache_usage_perc", "A replica's device KV pool use "
                               "(1 = full).", labels=["replica"])
        for load in loads:
            waiting.add_metric([load.replica_id], load.num_waiting)
            running.add_metric([load.replica_id], load.num_running)
            kv.add_metric([load.replica_id], load.kv_usage)
        yield from (live, waiting, running, kv)
