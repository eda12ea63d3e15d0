"""Reading usage: per tenant or per key, per UTC day. The admission settle script writes it.

    P:usage:tenant:{name}:{YYYYMMDD}   hash  requests, prompt_tokens, cached_tokens, completion_tokens, errors
    P:usage:key:{key_id}:{YYYYMMDD}    the same per key
    P:usage:model:{name}:{model}:{YYYYMMDD}  the same per tenant on one model (issue 42)
    P:usage:models:{name}              set   the models the tenant has usage on

A request is counted on the day it was admitted, when it is settled: settled
usage is exactly what the client was sent (a stream cut short counts the
tokens produced before the cut).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.tenancy.redis_conn import text, text_dict, unavailable_on_failure

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
    model: str | None = None
    """Set on a per-model row (`read_models`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def usage_key(prefix: str, scope: str, ident: str, day: str) -> str:
    """scope: "tenant", "key" or "model" (ident "{tenant}:{model}"); day: YYYYMMDD."""
    return f"{prefix}:usage:{scope}:{ident}:{day}"


class UsageReader:
    def __init__(self, client: aioredis.Redis, prefix: str = "ps") -> None:
        self.redis = client
        self.prefix = prefix

    async def read(self, scope: str, idents: list[str], first: dt.date, last: dt.date) -> list[UsageRow]:
        """Rows for the days in [first, last] that have any usage, by ident then day."""
        assert scope in ("tenant", "key", "model")
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
            tenant, _, model = ident.partition(":") if scope == "model" else (ident, "", "")
            rows.append(UsageRow(day=day.isoformat(), tenant=tenant if scope != "key" else "",
                                 key_id=ident if scope == "key" else None, model=model or None, **values))
        return rows

    async def read_models(self, tenant: str, first: dt.date, last: dt.date) -> list[UsageRow]:
        """The tenant's rows per model and day (the models it has usage on)."""
        with unavailable_on_failure():
            members = await self.redis.smembers(f"{self.prefix}:usage:models:{tenant}")  # type: ignore[misc]
        models = sorted(text(m) for m in members)
        return await self.read("model", [f"{tenant}:{m}" for m in models], first, last)
