"""The audit log: every admin change, appended to one Redis stream.

Each entry records when, who (the actor: "cli:<user>" or "admin-api"), the
action ("tenant.create", "key.rotate", ...), its target and a few details.
Plaintext keys never enter the log; keys are named by their id.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.tenancy.redis_conn import text, text_dict, unavailable_on_failure

MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class AuditEntry:
    id: str
    at: float
    actor: str
    action: str
    target: str
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "actor": self.actor, "action": self.action,
                "target": self.target, "details": self.details}


class AuditLog:
    def __init__(self, client: aioredis.Redis, prefix: str = "ps") -> None:
        self._redis = client
        self._key = f"{prefix}:audit"

    async def record(self, actor: str, action: str, target: str, **details: Any) -> None:
        fields = {"at": repr(time.time()), "actor": actor, "action": action, "target": target,
                  "details": json.dumps(details, sort_keys=True)}
        with unavailable_on_failure():
            await self._redis.xadd(self._key, fields, maxlen=MAX_ENTRIES, approximate=True)  # type: ignore[arg-type]

    async def read(self, limit: int = 100) -> list[AuditEntry]:
        """The newest `limit` entries, oldest first."""
        with unavailable_on_failure():
            rows = await self._redis.xrevrange(self._key, count=limit)
        entries = []
        for entry_id, raw in reversed(list(rows or [])):
            f = text_dict(raw)
            entries.append(AuditEntry(id=text(entry_id), at=float(f.get("at", 0)), actor=f.get("actor", ""),
                                      action=f.get("action", ""), target=f.get("target", ""),
                                      details=json.loads(f.get("details", "{}"))))
        return entries
