"""The engines announced in Redis, as the gateway reads them (engine/serving/announce.py writes).

One look is two round trips: the index set, then every member's record. A
member whose record expired (an engine that died without withdrawing) is
removed from the index, so the set does not grow forever. Whether a replica
serves the right model is checked at its handshake (replica_set.py). It knows the
registry's format (shared/engine_registry.py) and nothing about connections.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.engine_registry import EngineRecord, decode_record, index_key, record_key


class Discovery:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis, self._prefix = redis, prefix

    async def live(self) -> dict[str, EngineRecord]:
        """Announced and unexpired engines by address; raises redis errors (the caller keeps its last view)."""
        members = sorted(m.decode() if isinstance(m, bytes) else m
                         for m in await self._redis.smembers(index_key(self._prefix)))  # type: ignore[misc]
        if not members:
            return {}
        raws = await self._redis.mget([record_key(self._prefix, m) for m in members])
        expired = [m for m, raw in zip(members, raws, strict=True) if raw is None]
        if expired:
            await self._redis.srem(index_key(self._prefix), *expired)  # type: ignore[misc]
        found: dict[str, EngineRecord] = {}
        for raw in raws:
            record = decode_record(raw) if raw is not None else None
            if record is not None:
                found[record.address] = record
        return found
