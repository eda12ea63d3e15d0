"""Connecting to Redis, and turning its failures into one typed error.

`connect(url)` builds the client the gateway's lifespan and the admin CLI use:
short timeouts so that a dead Redis costs a request well under a second
instead of hanging it, and no blind retries (admission is not idempotent until
a reservation exists). redis-py's pool reconnects by itself on the next command
once Redis is back, so nothing here keeps state about being "down".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.tenancy.errors import TenancyUnavailable

UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError, OSError)


def redact_url(url: str) -> str:
    """The URL with any user and password replaced by *** (for logs, prints and error messages)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def connect(url: str, *, timeout_s: float = 1.0, max_connections: int = 64,
            pool_wait_s: float = 5.0) -> aioredis.Redis:
    """An async client with text replies and fail-fast timeouts (no network I/O happens here).

    The pool is blocking and small: Redis runs scripts one at a time, so more
    connections add no throughput, and a burst of requests waits a moment for
    a pooled connection instead of opening hundreds of sockets at once (which
    on a busy host times out connecting). A dead Redis still fails fast: a
    refused connection at once, an unanswered one after `timeout_s`, a hung
    server after the read timeout; `pool_wait_s` only bounds the wait for a
    pooled connection while all of them are busy (a starved process under a burst).
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=timeout_s,
        socket_timeout=max(timeout_s, 2.0),
        retry=Retry(NoBackoff(), 0),
        max_connections=max_connections,
        timeout=pool_wait_s,
    )
    return aioredis.Redis.from_pool(pool)


@contextmanager
def unavailable_on_failure() -> Iterator[None]:
    """Re-raise any connection-level Redis failure as TenancyUnavailable."""
    try:
        yield
    except UNREACHABLE as exc:
        raise TenancyUnavailable(f"{type(exc).__name__}: {exc}") from exc


def text(value: Any) -> str:
    """A reply value as str whether or not the client decodes responses."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def text_dict(raw: Any) -> dict[str, str]:
    """An HGETALL reply (dict or flat list) as {str: str}."""
    if isinstance(raw, dict):
        return {text(k): text(v) for k, v in raw.items()}
    items = list(raw or [])
    return {text(items[i]): text(items[i + 1]) for i in range(0, len(items), 2)}


async def ping(client: aioredis.Redis) -> bool:
    """True when Redis answers; never raises (for /health)."""
    try:
        return bool(await client.ping())
    except UNREACHABLE:
        return False
