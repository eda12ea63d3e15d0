"""How a gateway finds, watches and routes to several engine replicas: one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.replicas.policy import RoutingConfig


@dataclass(frozen=True)
class ReplicasConfig:
    addresses: tuple[str, ...] = ()
    """Engines listed in the configuration (`--engine` repeated or comma-separated)."""
    discover: bool = False
    """Also follow the engines announced in the gateway's Redis (`pageserve engine --redis-url`)."""
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    probe_interval_s: float = 0.5
    """How often every replica's stats are read (load for routing, progress for stall detection)."""
    stall_timeout_s: float = 15.0
    """A replica with work whose step counter has not moved, or that has not answered a stats
    probe, for this long is dropped from the live set; its requests fail over. It must exceed the
    longest step (a full prefill chunk on a CPU, under contention: seconds), or a busy replica is
    taken for a stalled one. A dead one leaves at once: its connection closes."""
    handshake_timeout_s: float = 2.0
    """A (re)joining replica must answer the handshake within this."""

    @property
    def enabled(self) -> bool:
        """More than one engine, or any announced one: the replica set replaces the single link."""
        return self.discover or len(self.addresses) > 1
