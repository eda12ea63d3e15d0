"""`Authorization: Bearer <key>` to the caller's tenancy context and admission, or a 401.

A generation request's path:

    key = bearer_key(request)                    # 401 at once for a missing or malformed header
    await check_key_first(key, store, recent)    # 401 before the body is read, parsed or tokenized
    ...                                          # read, parse, template, tokenize, check
    caller, ticket = await admit(key, store, admission, prompt_tokens, reserve)

An unauthenticated client never makes the gateway read its body, at any size:
the key is verified first. `admit` hands the key itself to the admission
script, which looks it up again and checks the quotas atomically
(`Admission.admit_key`); so a key verified a moment ago (`RecentKeys`, by hash)
skips the first check's round trip, and a hot key still costs one round trip
per request. Routes without quotas (`/v1/models`, `/tokenize`) use `authenticate`.

Owns reading the header and mapping the tenancy answers to HTTP errors; the
lookup itself belongs to `gateway/tenancy/`. The key is never logged nor echoed.
"""

from __future__ import annotations

import logging
from typing import Protocol

from starlette.requests import Request

from gateway.errors import AuthenticationError, ServiceUnavailable
from gateway.recent_keys import RecentKeys
from gateway.tenancy.admission import Admission, Ticket
from gateway.tenancy.errors import TenancyUnavailable
from gateway.tenancy.outage_policy import OutagePolicy
from gateway.tenancy.store import AuthContext

log = logging.getLogger("pageserve.gateway")
FAIL_CLOSED = OutagePolicy()

EARLY_CHECK_BYTES = 8 * 1024
"""Bodies declared larger than this (about 2,000 tokens of text) have their key verified before they are
read: the extra round trip is small next to tokenizing them, and it keeps bad keys from costing that work."""


class KeyStore(Protocol):
    async def authenticate(self, plaintext: str) -> AuthContext | None: ...


def bearer_key(request: Request) -> str:
    """The bearer token of the request, or a 401; no Redis (the key is verified later)."""
    header = request.headers.get("authorization")
    if not header:
        raise AuthenticationError(
            "missing API key: send it as 'Authorization: Bearer <key>'", code="missing_api_key"
        )
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "malformed Authorization header: expected 'Bearer <key>'", code="invalid_api_key"
        )
    return token


async def authenticate(request: Request, store: KeyStore) -> AuthContext:
    """The caller behind the request's key (one round trip), or a 401 / 503."""
    return await verify(bearer_key(request), store)


async def verify(key: str, store: KeyStore) -> AuthContext:
    try:
        auth = await store.authenticate(key)
    except TenancyUnavailable as e:
        log.warning("Redis unavailable: refused a request at its key check: %s", e.message)
        raise _unavailable() from None
    if auth is None:
        raise _rejected()
    return auth


async def admit(key: str, store: KeyStore, admission: Admission | None, prompt_tokens: int,
                reserve: int, outage: OutagePolicy | None = None,
                model: str = "", weight: float = 1.0) -> tuple[AuthContext, Ticket | None]:
    """Verify the key and reserve its quota in one round trip: (caller, ticket), or 401 / 429 / 503.

    Without quotas (admission None) this only verifies the key, and there is no ticket. While Redis
    is down, `outage` decides: a 503 (logged), or no ticket for a fail-open tenant. `model`: the served
    model id, whose per-tenant limits are checked in the same round trip; `weight`: its cost weight.
    """
    if admission is None:
        return await verify(key, store), None
    outage = outage or FAIL_CLOSED
    try:
        admitted = await admission.admit_key(key, prompt_tokens, reserve, model, weight)
    except TenancyUnavailable as e:
        return outage.during_outage(key, e), None  # or TenancyUnavailable -> 503 (app handler)
    if admitted is None:
        raise _rejected()
    outage.remember(key, admitted[0])
    return admitted


async def check_key_first(key: str, store: KeyStore, recent: RecentKeys) -> AuthContext:
    """A 401 (or 503) before any work on the body; a key verified in the last seconds passes at once.
    The caller's context (its model list: which model it may name) as verified then."""
    auth = recent.get(key)
    if auth is not None:
        return auth
    auth = await verify(key, store)
    recent.add(key, auth)
    return auth


def _rejected() -> AuthenticationError:
    return AuthenticationError("invalid, revoked or expired API key", code="invalid_api_key")


def _unavailable() -> ServiceUnavailable:
    return ServiceUnavailable("the key store is unavailable; retry shortly", code="service_unavailable")
