"""The live set of engine replicas: who is configured or announced, who answers, who makes progress.

Every `probe_interval_s` one pass (`refresh`):

    wanted = configured addresses ∪ announced ones (discovery.py; Redis down: the last view)
    replicas no longer wanted, or whose connection died ──> evicted (client closed)
    connected: no stats answer, or work but no step, for `stall_timeout_s` ──> evicted as stalled
    connected otherwise ──> a stats probe unless one is still out (load for routing)
    wanted but not connected ──> handshake (joins whatever model it serves: router.for_model routes
                                  each request to its model's replicas, issue 42)

Evicting closes the replica's client, which fails its open streams with
EngineDeadError: failover.py moves those that sent no token yet. An evicted
replica that is still wanted rejoins when it answers a handshake again, so an
engine restarted by systemd is picked up without restarting the gateway. It
knows nothing about HTTP or the routing rule (router.py, policy.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import redis.exceptions

from gateway.background_tasks import cancel_and_wait
from gateway.engine_client import EngineClient, EngineError, EngineUnavailableError
from gateway.replicas.config import ReplicasConfig
from gateway.replicas.counters import RoutingCounters
from gateway.replicas.discovery import Discovery
from gateway.replicas.replica import Replica
from gateway.replicas.router import Router, announced_adapters, combined_stats
from gateway.tenancy.model_access import Announcement
from shared.protocol import Stats

log = logging.getLogger("pageserve.gateway")

ClientFactory = Callable[[str, float], EngineClient]
"""(address, handshake timeout) -> an unstarted client."""


def _new_client(address: str, handshake_timeout_s: float) -> EngineClient:
    return EngineClient(address, handshake_timeout=handshake_timeout_s)


class ReplicaSet:
    def __init__(self, config: ReplicasConfig, discovery: Discovery | None = None,
                 client_factory: ClientFactory = _new_client) -> None:
        self.config = config
        self.counters = RoutingCounters()
        self._discovery = discovery
        self._new_client = client_factory
        self._replicas: dict[str, Replica] = {}
        self._announced: set[str] = set()
        self._unreachable: set[str] = set()
        self._registered: dict[str, str | None] = {}
        """Every model id (base or adapter -> parent) a replica served since start: one with no live
        replica left answers 503, not 404 (gateway/tenancy/model_access.py)."""
        self._task: asyncio.Task[None] | None = None
        self.router = Router(self)

    @property
    def client(self) -> Router | None:
        """The router while any replica is live (the gateway's EngineSource), else None (503)."""
        return self.router if self.live() else None

    def live(self) -> list[Replica]:
        return [r for r in self._replicas.values() if r.client.healthy]

    # The rest of the gateway's EngineSource (gateway/state.py): readiness, metrics, drain.

    @property
    def progressing(self) -> bool:
        """Some replica is live (each one's own progress is the stall rule's business: `_probe`)."""
        return bool(self.live())

    @property
    def latest_stats(self) -> Stats | None:
        """The live replicas' last stats added up (what /metrics exports), or None before any answer."""
        parts = [r.stats for r in self.live() if r.stats is not None]
        return combined_stats(parts) if parts else None

    @property
    def last_failure(self) -> str:
        return "" if self.live() else "no live engine replica"

    def fail_open(self, reason: str) -> None:
        """End every open request of this gateway, on every replica, with `reason` (SIGTERM drain)."""
        for replica in self._replicas.values():
            replica.client.fail(reason)

    async def start(self, timeout_s: float) -> None:
        """Wait until a first replica is live (engines may still be loading), then watch in the background."""
        deadline = time.monotonic() + timeout_s
        await self.refresh()
        while not self.live():
            if time.monotonic() >= deadline:
                raise EngineUnavailableError(f"no engine replica answered within {timeout_s:g} s "
                                             f"(configured: {', '.join(self.config.addresses) or 'none'})")
            await asyncio.sleep(self.config.probe_interval_s)
            await self.refresh()
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            try:
                await self.refresh()
            except Exception:  # one bad pass must not end the watching
                log.exception("refreshing the replica set failed")

    async def refresh(self) -> None:
        """One pass: follow the wanted set, evict the dead, the withdrawn and the stalled, probe the rest."""
        wanted = set(self.config.addresses) | await self._announced_now()
        for replica in list(self._replicas.values()):
            if replica.address not in wanted:
                await self._evict(replica, "withdrawn")
            elif not replica.client.healthy:
                await self._evict(replica, "dead")
        now = time.monotonic()
        for replica in self.live():
            if replica.stalled(now, self.config.stall_timeout_s):
                await self._evict(replica, "stalled")
            elif replica.probe is None or replica.probe.done():
                replica.probe = asyncio.create_task(self._probe(replica))
        await asyncio.gather(*(self._join(a) for a in sorted(wanted) if a not in self._replicas))

    async def _announced_now(self) -> set[str]:
        if self._discovery is None:
            return set()
        try:
            self._announced = set(await self._discovery.live())
        except (redis.exceptions.RedisError, OSError) as e:  # keep routing to the last view
            log.warning("could not read the announced engines from Redis: %s", e)
        return self._announced

    async def _join(self, address: str) -> None:
        client = self._new_client(address, self.config.handshake_timeout_s)
        try:
            await client.start()
        except EngineUnavailableError as e:
            if address not in self._unreachable:  # once per outage, not every pass
                self._unreachable.add(address)
                log.info("engine replica %s not available: %s", address, e)
            return
        info = client.model_info
        self._registered[info.model_name] = None
        self._registered.update(dict(announced_adapters(info)))
        self._unreachable.discard(address)
        self._replicas[address] = Replica(address, client)
        log.info("engine replica %s (%s) joined (%d live)", address, info.model_name, len(self.live()))

    def announcements(self) -> list[Announcement]:
        """What the model catalog is built from: each live replica's model and adapters."""
        return [Announcement(r.client.model_info.model_name, True, r.client.model_info.max_model_len,
                             announced_adapters(r.client.model_info)) for r in self.live()]

    @property
    def registered(self) -> list[str]:
        return list(self._registered)

    async def _probe(self, replica: Replica) -> None:
        """One stats request; a slow answer is awaited (a long step delays it), a missing one is
        judged by `Replica.stalled` from the time of the last answer."""
        try:
            stats = await replica.client.stats(timeout=self.config.stall_timeout_s)
        except (TimeoutError, EngineError) as e:  # dead or stalled: the next pass decides
            log.debug("stats probe of %s failed: %s", replica.address, e)
            return
        replica.on_stats(stats, time.monotonic())

    async def _evict(self, replica: Replica, reason: str) -> None:
        if self._replicas.pop(replica.address, None) is None:
            return
        self.counters.evicted(reason)
        if replica.probe is not None:
            replica.probe.cancel()
        log.error("engine replica %s left the live set (%s); %d live", replica.address, reason, len(self.live()))
        await replica.client.close()  # its open streams get EngineDeadError: failover.py takes over

    def metrics(self) -> dict[str, object]:
        """What a metrics page shows: the routing counters, and per live replica its last known load."""
        replicas = {r.address: {"num_waiting": (load := r.load()).num_waiting, "num_running": load.num_running,
                                "kv_usage": load.kv_usage} for r in self.live()}
        return {"live_replicas": len(replicas), "replicas": replicas, **self.counters.snapshot()}

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        for replica in list(self._replicas.values()):
            if replica.probe is not None:
                replica.probe.cancel()
            await replica.client.close()
        self._replicas.clear()
