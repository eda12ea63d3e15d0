"""Service tiers: how a tenant's tier becomes engine priority, fair-share weight and default limits.

A tier is chosen when the tenant is created (`pageserve admin tenant create
NAME --tier premium`). Priority follows the engine's convention, lower is more
urgent; the weight is the tenant's share among requests of equal priority. The
default limits apply to every tenant of the tier unless `quota set` overrides
a field for that tenant. This module knows nothing of Redis or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tenancy.errors import InvalidArgument
from gateway.tenancy.quota import Quota


@dataclass(frozen=True)
class Tier:
    name: str
    priority: int
    """Engine priority: lower is scheduled first and preempted last."""
    weight: float
    """Fair-share weight among tenants of the same priority."""
    limits: Quota
    """Default per-tenant limits for the tier (None in a field: unlimited)."""


TIERS: dict[str, Tier] = {
    t.name: t
    for t in (
        Tier("free", priority=2, weight=1.0,
             limits=Quota(rpm=60, input_tpm=60_000, output_tpm=20_000, concurrency=4, daily_tokens=200_000)),
        Tier("standard", priority=1, weight=2.0,
             limits=Quota(rpm=600, input_tpm=1_000_000, output_tpm=200_000, concurrency=64)),
        Tier("premium", priority=0, weight=4.0,
             limits=Quota(rpm=6_000, input_tpm=10_000_000, output_tpm=2_000_000, concurrency=256)),
    )
}
DEFAULT_TIER = "standard"


def get_tier(name: str) -> Tier:
    try:
        return TIERS[name]
    except KeyError:
        raise InvalidArgument(f"unknown tier {name!r}; choose one of {', '.join(TIERS)}") from None
