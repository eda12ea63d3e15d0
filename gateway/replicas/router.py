"""The one engine the rest of the gateway sees when there are several: it routes each request.

`Router` has the shape of a single engine client (`EngineHandle` in
gateway/state.py): `model_info`, `submit`, `stats`. `submit` asks the policy
(policy.py) for a replica among the live ones (replica_set.py) and returns a
failover stream (failover.py). `model_info` is the most any live replica
accepts: the smallest context and KV pool, so a request the gateway admits fits
wherever it lands. It knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

from gateway.engine_client import EngineDeadError
from gateway.replicas.config import ReplicasConfig
from gateway.replicas.counters import RoutingCounters
from gateway.replicas.failover import FailoverStream
from gateway.replicas.policy import affinity_key, choose
from gateway.replicas.replica import Replica
from shared.model_info import ModelInfo
from shared.protocol import AddRequest, PriorityLoad, Stats, TenantLoad


class LiveSet(Protocol):
    """What the router reads of the replica set (replica_set.py)."""

    @property
    def config(self) -> ReplicasConfig: ...
    @property
    def counters(self) -> RoutingCounters: ...
    def live(self) -> list[Replica]: ...


class Router:
    def __init__(self, replicas: LiveSet) -> None:
        self._replicas = replicas
        self.counters = replicas.counters
        self._last_info: ModelInfo | None = None

    @property
    def model_info(self) -> ModelInfo:
        infos = [r.client.model_info for r in self._replicas.live()]
        if infos:
            self._last_info = dataclasses.replace(
                infos[0], max_model_len=min(i.max_model_len for i in infos),
                num_blocks=min(i.num_blocks for i in infos))
        if self._last_info is None:
            raise EngineDeadError("no live engine replica")
        return self._last_info  # all replicas just died: the last view, the request then fails over to none

    def pick(self, request: AddRequest, exclude: set[str]) -> Replica | None:
        """The replica for this request among the live ones not in `exclude`; counted as routed there."""
        candidates = {r.address: r for r in self._replicas.live() if r.address not in exclude}
        if not candidates:
            return None
        routing = self._replicas.config.routing
        block_size = next(iter(candidates.values())).client.model_info.block_size
        key = affinity_key(request.prompt_token_ids, request.cache_salt, block_size, routing)
        decision = choose(key, [r.load() for r in candidates.values()], routing)
        self.counters.route(decision.replica_id, decision.reason)
        return candidates[decision.replica_id]

    async def submit(self, request: AddRequest) -> FailoverStream:
        stream = FailoverStream(self, request)
        await stream.open()
        return stream

    async def stats(self, timeout: float = 5.0) -> Stats:
        """The live replicas' stats added up (per-step figures: the largest, and the mean of means)."""
        parts = await asyncio.gather(*(r.client.stats(timeout) for r in self._replicas.live()))
        if not parts:
            raise EngineDeadError("no live engine replica")
        return combined_stats(parts)


def combined_stats(parts: list[Stats]) -> Stats:
    """Counts added up; per-step figures the largest and the mean of means; the earliest start;
    per-priority and per-tenant loads added up by their key (one series each in /metrics)."""
    numbers = [f.name for f in dataclasses.fields(Stats) if f.name not in ("by_priority", "by_tenant")]
    total = Stats(*(sum(getattr(s, name) for s in parts) for name in numbers))
    priorities: dict[int, list[int]] = {}
    for load in (p for s in parts for p in s.by_priority):
        counts = priorities.setdefault(load.priority, [0, 0])
        counts[0] += load.queued
        counts[1] += load.running
    tenants: dict[str, list[int]] = {}
    for t in (t for s in parts for t in s.by_tenant):
        counts = tenants.setdefault(t.tenant_id, [0, 0])
        counts[0] += t.in_flight
        counts[1] += t.generated_tokens
    return dataclasses.replace(
        total, max_requests_per_step=max(s.max_requests_per_step for s in parts),
        mean_requests_per_step=sum(s.mean_requests_per_step for s in parts) / len(parts),
        started_at=min(s.started_at for s in parts),
        by_priority=[PriorityLoad(p, q, r) for p, (q, r) in sorted(priorities.items())],
        by_tenant=[TenantLoad(t, f, g) for t, (f, g) in sorted(tenants.items())])
