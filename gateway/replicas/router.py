"""The one engine the rest of the gateway sees when there are several: it routes each request.

`Router` has the shape of a single engine client (`EngineHandle` in
gateway/state.py): `model_info`, `submit`, `stats`. `submit` asks the policy
(policy.py) for a replica among the live ones (replica_set.py) and returns a
failover stream (failover.py). `model_info` is the most any live replica
accepts: the smallest context and KV pool, so a request the gateway admits fits
wherever it lands. With several models behind one gateway (issue 42),
`for_model(id)` is the same router narrowed to the replicas serving that model
id (a base model, or a LoRA adapter an engine announces), with the id in the
affinity key so one tenant's prompt on two adapters of a base need not meet.
It knows nothing about HTTP or who may use which model (gateway/tenancy/model_access.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Protocol

from gateway.engine_client import EngineDeadError
from gateway.replicas.config import ReplicasConfig
from gateway.replicas.counters import RoutingCounters
from gateway.replicas.failover import FailoverStream
from gateway.replicas.policy import affinity_key, choose
from gateway.replicas.replica import Replica
from shared.model_info import ModelInfo
from shared.protocol import AddRequest, PriorityLoad, Stats, TenantLoad


def announced_adapters(info: object) -> tuple[tuple[str, str], ...]:
    """(name, parent) of the LoRA adapters an engine announces in its Ready info (issue 43), or ().

    Read by name so this works before and after the adapter field exists: entries may be
    mappings {"name", "parent"} or objects with those attributes."""
    found: list[tuple[str, str]] = []
    base = str(getattr(info, "model_name", ""))
    for entry in getattr(info, "adapters", None) or ():
        name = entry.get("name") if isinstance(entry, dict) else getattr(entry, "name", None)
        parent = entry.get("parent") if isinstance(entry, dict) else getattr(entry, "parent", None)
        if name:
            found.append((str(name), str(parent or base)))
    return tuple(found)


def serves(replica: Replica, model_id: str) -> bool:
    """The replica's engine runs `model_id`: its base model or one of its announced adapters."""
    info = replica.client.model_info
    return info.model_name == model_id or any(name == model_id for name, _ in announced_adapters(info))


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

    def pick(self, request: AddRequest, exclude: set[str], model: str | None = None) -> Replica | None:
        """The replica for this request among the live ones not in `exclude` (and serving `model`, if
        given); counted as routed there."""
        candidates = {r.address: r for r in self._replicas.live()
                      if r.address not in exclude and (model is None or serves(r, model))}
        if not candidates:
            return None
        routing = self._replicas.config.routing
        block_size = next(iter(candidates.values())).client.model_info.block_size
        salt = request.cache_salt if model is None else f"{request.cache_salt}\x00{model}"
        key = affinity_key(request.prompt_token_ids, salt, block_size, routing)
        decision = choose(key, [r.load() for r in candidates.values()], routing)
        self.counters.route(decision.replica_id, decision.reason)
        return candidates[decision.replica_id]

    async def submit(self, request: AddRequest) -> FailoverStream:
        stream = FailoverStream(self, request)
        await stream.open()
        return stream

    def for_model(self, model_id: str) -> ModelRouter:
        return ModelRouter(self, model_id)

    def replicas_of(self, model_id: str) -> list[Replica]:
        return [r for r in self._replicas.live() if serves(r, model_id)]

    async def stats(self, timeout: float = 5.0) -> Stats:
        """The live replicas' stats added up (per-step figures: the largest, and the mean of means)."""
        parts = await asyncio.gather(*(r.client.stats(timeout) for r in self._replicas.live()))
        if not parts:
            raise EngineDeadError("no live engine replica")
        return combined_stats(parts)


class ModelRouter:
    """The router narrowed to one model id: an EngineHandle whose requests go only to its replicas."""

    def __init__(self, router: Router, model_id: str) -> None:
        self._router, self.model_id = router, model_id
        self.counters = router.counters

    @property
    def model_info(self) -> ModelInfo:
        infos = [r.client.model_info for r in self._router.replicas_of(self.model_id)]
        if not infos:
            raise EngineDeadError(f"no live engine replica serves {self.model_id}")
        return dataclasses.replace(infos[0], model_name=self.model_id,
                                   max_model_len=min(i.max_model_len for i in infos),
                                   num_blocks=min(i.num_blocks for i in infos))

    def pick(self, request: AddRequest, exclude: set[str]) -> Replica | None:
        return self._router.pick(request, exclude, self.model_id)

    async def submit(self, request: AddRequest) -> FailoverStream:
        stream = FailoverStream(self, request)
        await stream.open()
        return stream

    async def stats(self, timeout: float = 5.0) -> Stats:
        return await self._router.stats(timeout)


def combined_stats(parts: list[Stats]) -> Stats:
    """Counts added up; per-step figures the largest and the mean of means; the earliest start;
    per-priority and per-tenant loads added up by their key (one series each in /metrics); adapter names
    united, load-time buckets added up."""
    numbers = [f.name for f in dataclasses.fields(Stats) if f.name not in _LISTS]
    total = Stats(**{name: sum(getattr(s, name) for s in parts) for name in numbers})
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
        by_tenant=[TenantLoad(t, f, g) for t, (f, g) in sorted(tenants.items())],
        lora_running=sorted({n for s in parts for n in s.lora_running}),
        lora_waiting=sorted({n for s in parts for n in s.lora_waiting}),
        lora_load_buckets=[sum(c) for c in itertools.zip_longest(*(s.lora_load_buckets for s in parts), fillvalue=0)])


_LISTS = ("by_priority", "by_tenant", "lora_running", "lora_waiting", "lora_load_buckets")
"""Stats fields that are not added up as numbers (combined_stats merges each its own way)."""
