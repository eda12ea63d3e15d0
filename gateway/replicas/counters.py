"""Routing decisions as plain counters, each event also told to an observer (the Prometheus export).

Counted where the decision is made (router.py, failover.py, replica_set.py),
once per event, through the methods below. Per replica: requests routed there.
Process-local: each gateway worker counts its own requests; the observer
(gateway/routing_metrics.py) turns the events into prometheus-client counters,
which its multiprocess mode sums over workers. Nothing here exports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.replicas.policy import RouteReason

RoutingEvent = Literal["retry", "failover_exhausted", "cut_by_replica_loss"]


class RoutingObserver(Protocol):
    def routed(self, replica_id: str, reason: RouteReason) -> None: ...
    def event(self, kind: RoutingEvent) -> None: ...
    def evicted(self, reason: str) -> None: ...


@dataclass
class RoutingCounters:
    decisions: Counter[RouteReason] = field(default_factory=Counter)
    """affinity (the prefix's replica), overflow (it was overloaded), load (no full block to share)."""
    routed: Counter[str] = field(default_factory=Counter)
    """Requests sent per replica address, retries included."""
    retries: int = 0
    """Requests moved to another replica because theirs died before sending a token."""
    failovers_exhausted: int = 0
    """Requests that had no token yet but found no other live replica: they got the 503."""
    cut_by_replica_loss: int = 0
    """Requests that had sent tokens when their replica was lost: they ended with an error."""
    evictions: Counter[str] = field(default_factory=Counter)
    """Replicas dropped from the live set, by reason: dead, stalled, withdrawn."""
    observer: RoutingObserver | None = None
    """Told every event as it is counted (set once, when the gateway's metrics are wired)."""

    def route(self, replica_id: str, reason: RouteReason) -> None:
        self.decisions[reason] += 1
        self.routed[replica_id] += 1
        if self.observer is not None:
            self.observer.routed(replica_id, reason)

    def retried(self) -> None:
        self.retries += 1
        self._tell("retry")

    def failover_exhausted(self) -> None:
        self.failovers_exhausted += 1
        self._tell("failover_exhausted")

    def cut(self) -> None:
        self.cut_by_replica_loss += 1
        self._tell("cut_by_replica_loss")

    def evicted(self, reason: str) -> None:
        self.evictions[reason] += 1
        if self.observer is not None:
            self.observer.evicted(reason)

    def _tell(self, kind: RoutingEvent) -> None:
        if self.observer is not None:
            self.observer.event(kind)

    def snapshot(self) -> dict[str, object]:
        """A JSON-ready copy: {"decisions": {...}, "routed": {...}, "retries": n, ...}."""
        return {
            "decisions": dict(self.decisions),
            "routed": dict(self.routed),
            "retries": self.retries,
            "failovers_exhausted": self.failovers_exhausted,
            "cut_by_replica_loss": self.cut_by_replica_loss,
            "evictions": dict(self.evictions),
        }
