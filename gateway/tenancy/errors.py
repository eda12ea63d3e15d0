"""Typed errors of the tenancy layer: what the gateway and the admin CLI catch.

Three families: a management mistake (unknown tenant, duplicate name, bad
quota value) that the CLI prints and the admin routes map to 4xx; a quota
rejection that the gateway maps to 429 with OpenAI's body and headers; and
Redis being unreachable, which the gateway maps to 503 (admission fails closed).
No message here ever contains an API key: keys are identified by their id.
This module imports nothing from the HTTP app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class TenancyError(Exception):
    """Base of every tenancy error."""


class InvalidArgument(TenancyError):
    """A name, tier or quota value that cannot be accepted (admin input)."""


class TenantExists(TenancyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} already exists")
        self.name = name


class TenantNotFound(TenancyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} does not exist")
        self.name = name


class KeyNotFound(TenancyError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"API key {key_id!r} does not exist")
        self.key_id = key_id


class TenancyUnavailable(TenancyError):
    """Redis cannot be reached: the gateway answers 503 and retries on the next request.

    The connection pool reconnects by itself; nothing needs to be restarted.
    """

    status_code = 503

    def __init__(self, detail: str = "") -> None:
        message = "the quota and key service is unavailable (Redis is unreachable); retry shortly"
        super().__init__(message)
        self.message = message
        self.detail = detail  # the driver's text, for logs only (it never holds a key)


@dataclass
class QuotaExceeded(TenancyError):
    """A request was refused by a limit; nothing was charged.

    `body()` and `headers` are ready for a 429 response: OpenAI's error shape,
    `retry-after` (whole seconds, rounded up), `retry-after-ms`, and the
    `x-ratelimit-*` values as they stood when the request was refused.
    """

    message: str
    limit_type: str  # "requests" | "tokens"
    code: str  # "rate_limit_exceeded" | "insufficient_quota"
    retry_after_ms: int
    headers: dict[str, str] = field(default_factory=dict)
    fits: bool = True
    """False when the request alone exceeds the limit: retrying it cannot succeed."""
    limit: str = ""
    """Which limit refused it: rpm, input_tpm, output_tpm, concurrency, daily_tokens, monthly_tokens."""

    status_code = 429

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def retry_after_s(self) -> int:
        return max(1, -(-self.retry_after_ms // 1000))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.limit_type, "param": None, "code": self.code}}
