"""Which replica serves a request: prefix affinity first, then load. Pure: no I/O, no clock.

    prompt ──(first `affinity_blocks` full blocks, the tenant's cache salt)──> prefix hash
    prefix hash ──(rendezvous: highest sha256(hash + replica id))──> the affine replica
    affine replica overloaded (too many waiting requests, KV pool nearly full)? ──> least loaded

The prefix hash is the engine's own block hash (shared/block_hash.py), salted by
the tenant's cache salt, so two requests that would share cached KV blocks in
an engine are sent to the same engine, and two tenants never meet by design.
Rendezvous (highest random weight) hashing keeps the mapping stable: when a
replica joins it takes only the keys it now wins, when one leaves only its own
keys move. A prompt shorter than one block has nothing to share: it goes to the
least loaded replica. It knows nothing about sockets, Redis or HTTP.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.block_hash import BlockHash, prefix_hash

RouteReason = Literal["affinity", "overflow", "load"]
"""affinity: the prefix's own replica; overflow: it was overloaded; load: no full block to share."""


@dataclass(frozen=True)
class RoutingConfig:
    affinity_blocks: int = 4
    """Full KV blocks of the prompt that name its prefix (4 x 16 tokens: a system prompt's head)."""
    max_waiting: int = 4
    """An affine replica with more waiting requests than this is overloaded (its queue, not its batch)."""
    max_kv_usage: float = 0.95
    """An affine replica whose KV pool is fuller than this is overloaded (it would preempt or queue)."""


@dataclass(frozen=True)
class ReplicaLoad:
    """A live replica as the router sees it: the engine's last stats plus what was sent since."""

    replica_id: str
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0
    """Used fraction of the device KV pool, 0..1."""


@dataclass(frozen=True)
class Decision:
    replica_id: str
    reason: RouteReason
    affine_id: str | None
    """The replica the prefix maps to (None without a full block); equals replica_id on a hit."""


def affinity_key(token_ids: Sequence[int], cache_salt: str, block_size: int, config: RoutingConfig) -> BlockHash | None:
    return prefix_hash(token_ids, cache_salt, block_size, config.affinity_blocks)


def rendezvous_order(key: bytes, replica_ids: Sequence[str]) -> list[str]:
    """Replicas from most to least preferred for `key`; the order of the others never changes
    when one is added or removed, which is what keeps the mapping stable."""
    def weight(replica_id: str) -> bytes:
        return hashlib.sha256(key + b"\0" + replica_id.encode()).digest()

    return sorted(replica_ids, key=lambda r: (weight(r), r), reverse=True)


def overloaded(load: ReplicaLoad, config: RoutingConfig) -> bool:
    return load.num_waiting > config.max_waiting or load.kv_usage > config.max_kv_usage


def _busyness(load: ReplicaLoad) -> tuple[int, float, int]:
    return (load.num_waiting, load.kv_usage, load.num_running)


def choose(key: bytes | None, loads: Sequence[ReplicaLoad], config: RoutingConfig) -> Decision:
    """The replica for one request among `loads` (the live replicas, at least one)."""
    if not loads:
        raise ValueError("no live replica to route to")
    by_id = {load.replica_id: load for load in loads}
    if key is None:
        least = min(loads, key=lambda load: (_busyness(load), load.replica_id))
        return Decision(least.replica_id, "load", None)
    order = rendezvous_order(key, list(by_id))
    affine = by_id[order[0]]
    if not overloaded(affine, config):
        return Decision(affine.replica_id, "affinity", affine.replica_id)
    # Ties go to the earlier replica in the key's own order: overflow of one prefix keeps meeting
    # on the same second replica, where its blocks are cached by the first overflowing request.
    rank = {replica_id: i for i, replica_id in enumerate(order)}
    least = min(loads, key=lambda load: (_busyness(load), rank[load.replica_id]))
    reason: RouteReason = "affinity" if least.replica_id == affine.replica_id else "overflow"
    return Decision(least.replica_id, reason, affine.replica_id)
