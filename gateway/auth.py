"""`Authorization: Bearer <key>` to the caller's tenancy context, or a 401.

Owns reading the header and mapping the store's answer to HTTP errors; the key
lookup itself (hashes in Redis) belongs to `gateway/tenancy/store.py`. The key is
never logged nor echoed in an error message.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request

from gateway.errors import AuthenticationError, ServiceUnavailable
from gateway.tenancy.errors import TenancyUnavailable
from gateway.tenancy.store import AuthContext


class KeyStore(Protocol):
    async def authenticate(self, plaintext: str) -> AuthContext | None: ...


async def authenticate(request: Request, store: KeyStore) -> AuthContext:
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
    try:
        auth = await store.authenticate(token)
    except TenancyUnavailable:
        raise ServiceUnavailable(
            "the key store is unavailable; retry shortly", code="service_unavailable"
        ) from None
    if auth is None:
        raise AuthenticationError("invalid, revoked or expired API key", code="invalid_api_key")
    return auth
