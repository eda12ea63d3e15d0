"""Routing decisions as plain counters: the metrics page reads `snapshot()`, nothing here exports.

Counted where the decision is made (router.py, failover.py, replica_set.py),
once per event. Per replica: requests routed there. Process-local, like every
gateway metric: each gateway worker counts its own requests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gateway.replicas.policy import RouteReason


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

    def route(self, replica_id: str, reason: RouteReason) -> None:
        self.decisions[reason] += 1
        self.routed[replica_id] += 1

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
