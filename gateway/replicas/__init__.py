"""Several engine replicas behind one gateway: which ones are live, where each request goes, failover.

    config.py       ReplicasConfig: the engine addresses, Redis discovery, probe and stall timings
    policy.py       pure routing: prefix affinity (the engine's salted block hash, rendezvous
                    hashing) first, the least loaded replica when the affine one is overloaded
    discovery.py    the engines announced in Redis (shared/engine_registry.py's keys), read-only
    replica.py      one connected replica: its client, last stats, load, the stall rule
    replica_set.py  the live set: connects, probes stats, drops dead or stalled replicas, rejoins them
    router.py       the EngineHandle the rest of the gateway uses: routes submit(), merges model info
    failover.py     a request's stream that moves to another replica while no token was sent
    counters.py     routing decisions, retries and evictions as plain counters, each event told to an
                    observer (gateway/routing_metrics.py exports them on /metrics)

It knows nothing about HTTP, tokenizers or tenants beyond a request's cache salt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from gateway.replicas.config import ReplicasConfig
    from gateway.replicas.counters import RoutingObserver
    from gateway.replicas.policy import ReplicaLoad
    from gateway.replicas.replica_set import ReplicaSet

__all__ = ["observe_routing", "open_replicas", "replica_loads", "routing_metrics"]


def routing_metrics(engine_source: object) -> dict[str, object] | None:
    """The replica set's counters and per-replica load for the metrics page (`GatewayState.engine`);
    None when the gateway runs the single engine link."""
    from gateway.replicas.replica_set import ReplicaSet

    return engine_source.metrics() if isinstance(engine_source, ReplicaSet) else None


def observe_routing(engine_source: object, observer: RoutingObserver) -> bool:
    """Tell `observer` every routing event from now on; False for the single engine link (no routing)."""
    from gateway.replicas.replica_set import ReplicaSet

    if not isinstance(engine_source, ReplicaSet):
        return False
    engine_source.counters.observer = observer
    return True


def replica_loads(engine_source: object) -> list[ReplicaLoad] | None:
    """Each live replica's load as the router sees it now; None for the single engine link."""
    from gateway.replicas.replica_set import ReplicaSet

    return [r.load() for r in engine_source.live()] if isinstance(engine_source, ReplicaSet) else None


def open_replicas(config: ReplicasConfig, redis: aioredis.Redis, redis_prefix: str) -> ReplicaSet:
    """The replica set the gateway's lifespan starts (`await .start(timeout)`) and closes."""
    from gateway.replicas.discovery import Discovery
    from gateway.replicas.replica_set import ReplicaSet

    return ReplicaSet(config, Discovery(redis, redis_prefix) if config.discover else None)
