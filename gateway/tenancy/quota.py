"""Limits as data: the `Quota` dataclass and its Redis hash encoding.

Six limits, each `None` for unlimited:

    rpm             requests per minute            (token bucket, refills continuously)
    input_tpm       prompt tokens per minute       (token bucket)
    output_tpm      completion tokens per minute   (token bucket; reserved as max_tokens, refunded on settle)
    concurrency     requests in flight             (leases with an expiry)
    daily_tokens    prompt + completion per UTC day    (budget; exhausting it is `insufficient_quota`)
    monthly_tokens  prompt + completion per UTC month  (budget)

A tenant's effective limits are its tier's defaults overridden field by field
by `quota set`; a key has no limits of its own unless `quota set --key` gives
some, and then both the tenant's and the key's must admit a request. In Redis
an override is a hash field; the value -1 stores "unlimited" explicitly, an
absent field means "inherit". This module knows nothing of Redis clients.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from gateway.tenancy.errors import InvalidArgument

UNLIMITED = -1
LIMIT_FIELDS = ("rpm", "input_tpm", "output_tpm", "concurrency", "daily_tokens", "monthly_tokens")
LIMIT_HELP = {
    "rpm": "requests per minute",
    "input_tpm": "prompt tokens per minute",
    "output_tpm": "completion tokens per minute (max_tokens reserved, the unused part refunded)",
    "concurrency": "requests in flight at once",
    "daily_tokens": "prompt + completion tokens per UTC day",
    "monthly_tokens": "prompt + completion tokens per UTC month",
}


@dataclass(frozen=True)
class Quota:
    rpm: int | None = None
    input_tpm: int | None = None
    output_tpm: int | None = None
    concurrency: int | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None

    def as_args(self) -> list[int]:
        """The six limits in LIMIT_FIELDS order, -1 for unlimited (the Lua script's encoding)."""
        return [UNLIMITED if v is None else v for v in (getattr(self, f) for f in LIMIT_FIELDS)]

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


def parse_limit(field_name: str, text: str) -> int | None | str:
    """Admin input for one field: an integer >= 0, "unlimited", or "default" (drop the override).

    Returns the int, None for unlimited, or the string "default".
    """
    if field_name not in LIMIT_FIELDS:
        raise InvalidArgument(f"unknown limit {field_name!r}; choose from {', '.join(LIMIT_FIELDS)}")
    value = text.strip().lower()
    if value in ("unlimited", "none"):
        return None
    if value == "default":
        return "default"
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"{field_name}: expected an integer >= 0, 'unlimited' or 'default', got {text!r}") from None
    if number < 0:
        raise InvalidArgument(f"{field_name}: must be >= 0, got {number}")
    return number


def decode_overrides(raw: dict[str, str]) -> dict[str, int | None]:
    """A Redis quota hash as {field: limit or None for unlimited}; unknown fields are ignored."""
    out: dict[str, int | None] = {}
    for name in LIMIT_FIELDS:
        if name in raw:
            number = int(raw[name])
            out[name] = None if number == UNLIMITED else number
    return out


def merge(base: Quota, overrides: dict[str, int | None]) -> Quota:
    values = {f.name: getattr(base, f.name) for f in fields(Quota)}
    values.update(overrides)
    return Quota(**values)
