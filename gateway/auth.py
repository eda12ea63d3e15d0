"""`Authorization: Bearer <key>` to the caller's tenancy context and admission, or a 401.

A generation request costs one Redis round trip before the engine sees it:

    key = bearer_key(request)                          # 401 at once for a missing or malformed header
    async with key_checked_first(request, key, store): # read, parse, tokenize, check: a refusal in
        ...                                            #   here is a 401 instead when the key is bad
    caller, ticket = await admit(key, store, admission, prompt_tokens, reserve)

`admit` hands the key itself to the admission script, which looks it up and
checks the quotas atomically (`Admission.admit_key`), so the key is verified
only after the body was read. Two rules keep that cheap and the errors as they
were: a body declared over `EARLY_CHECK_BYTES` (or of unknown length) has its
key verified before it is read (an unauthenticated client never gets a large
body parsed and tokenized), and a refusal raised before admission (400, 404,
413, engine down) is sent only once the key is known good. Routes without quotas (`/v1/models`) use `authenticate`.

Owns reading the header and mapping the tenancy answers to HTTP errors; the
lookup itself belongs to `gateway/tenancy/`. The key is never logged nor echoed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.requests import Request

from gateway.errors import AuthenticationError, ServiceUnavailable
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
                reserve: int, outage: OutagePolicy | None = None) -> tuple[AuthContext, Ticket | None]:
    """Verify the key and reserve its quota in one round trip: (caller, ticket), or 401 / 429 / 503.

    Without quotas (admission None) this only verifies the key, and there is no ticket. While Redis
    is down, `outage` decides: a 503 (logged), or no ticket for a fail-open tenant.
    """
    if admission is None:
        return await verify(key, store), None
    outage = outage or FAIL_CLOSED
    try:
        admitted = await admission.admit_key(key, prompt_tokens, reserve)
    except TenancyUnavailable as e:
        return outage.during_outage(key, e), None  # or TenancyUnavailable -> 503 (app handler)
    if admitted is None:
        raise _rejected()
    outage.remember(key, admitted[0])
    return admitted


@contextlib.asynccontextmanager
async def key_checked_first(request: Request, key: str, store: KeyStore) -> AsyncIterator[None]:
    """Wrap everything between the header and admission: a bad key is told 401 whatever else is wrong.

    A body declared over EARLY_CHECK_BYTES (or of no declared length) has its
    key verified before the block runs, so it is never read for a bad key;
    otherwise a refusal raised inside is sent only after the key verified.
    """
    declared = request.headers.get("content-length", "")
    verified = not declared.isdigit() or int(declared) > EARLY_CHECK_BYTES
    if verified:
        await verify(key, store)
    try:
        yield
    except Exception:  # a 4xx or 503 above all, but an unexpected 500 is no different
        if not verified:
            await verify(key, store)
        raise


def _rejected() -> AuthenticationError:
    return AuthenticationError("invalid, revoked or expired API key", code="invalid_api_key")


def _unavailable() -> ServiceUnavailable:
    return ServiceUnavailable("the key store is unavailable; retry shortly", code="service_unavailable")
