"""One connected engine replica as the gateway tracks it: its client, last stats, load and liveness.

Pure bookkeeping over the client the replica set (replica_set.py) connected:
the load the router (policy.py) weighs, and the stall rule the replica set
applies. It sends nothing itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gateway.engine_client import EngineClient
from gateway.replicas.policy import ReplicaLoad
from shared.protocol import Stats


@dataclass
class Replica:
    address: str
    client: EngineClient
    stats: Stats | None = None
    open_at_probe: int = 0
    """This gateway's open requests on the replica when the last stats answer came."""
    answered_at: float = field(default_factory=time.monotonic)
    progress_at: float = field(default_factory=time.monotonic)
    probe: asyncio.Task[None] | None = None
    """The stats request in flight: one at a time, however long a step takes to let it through."""

    def load(self) -> ReplicaLoad:
        # Requests opened here since the last answer were not in the engine's counts yet: they
        # are waiting. Those that finished meanwhile leave the open count, so the guess decays.
        new = max(0, self.client.num_open_streams - self.open_at_probe)
        s = self.stats
        if s is None:
            return ReplicaLoad(self.address, num_waiting=new)
        kv_usage = 1.0 - s.num_free_blocks / s.num_total_blocks if s.num_total_blocks else 0.0
        return ReplicaLoad(self.address, s.num_waiting + new, s.num_running, kv_usage)

    def on_stats(self, stats: Stats, now: float) -> None:
        busy = stats.num_running + stats.num_waiting + stats.num_swapped > 0
        if self.stats is None or not busy or stats.num_steps != self.stats.num_steps:
            self.progress_at = now
        self.stats, self.answered_at = stats, now
        self.open_at_probe = self.client.num_open_streams

    def stalled(self, now: float, timeout_s: float) -> bool:
        return now - self.answered_at > timeout_s or now - self.progress_at > timeout_s
