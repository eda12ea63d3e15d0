"""Reading usage: per tenant or per key, per UTC day. The admission settle script writes it.

    P:usage:tenant:{name}:{YYYYMMDD}   hash  requests, prompt_tokens, cached_tokens, completion_tokens, errors
    P:usage:key:{key_id}:{YYYYMMDD}    the same per key

A request is counted on the day it was admitted, when it is settled: settled
usage is exactly what the client was sent (a stream cut short counts the
tokens produced before the cut).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.tenancy.redis_conn import text_dict, unavailable_on_failure

USAGE_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "errors")


@dataclass(frozen=True)
class UsageRow:
    day: str  # YYYY-MM-DD
    tenant: str
    key_id: str | None
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def usage_key(prefix: str, scope: str, ident: str, day: str) -> str:
    """scope: "tenant" or "key"; day: YYYYMMDD."""
    return f"{prefix}:usage:{scope}:{ident}:{day}"


class UsageReader:
    def __init__(self, client: aioredis.Redis, prefix: str = "ps") -> None:
        self.redis = client
        self.prefix = prefix

    async def read(self, scope: str, idents: list[str], first: dt.date, last: dt.date) -> list[UsageRow]:
        """Rows for the days in [first, last] that have any usage, by ident then day."""
        assert scope in ("tenant", "key")
        days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
        wanted = [(ident, day) for ident in idents for day in days]
        with unavailable_on_failure():
            async with self.redis.pipeline(transaction=False) as pipe:
                for ident, day in wanted:
                    pipe.hgetall(usage_key(self.prefix, scope, ident, day.strftime("%Y%m%d")))
                raw_rows = await pipe.execute()
        rows = []
        for (ident, day), raw in zip(wanted, raw_rows, strict=True):
            counts = text_dict(raw)
            if not counts:
                continue
            values = {f: int(counts.get(f, 0)) for f in USAGE_FIELDS}
            rows.append(UsageRow(day=day.isoformat(), tenant=ident if scope == "tenant" else "",
                                 key_id=ident if scope == "key" else None, **values))
        return rows
