"""Multi-tenancy in Redis: tenants, hashed API keys, quotas, admission and usage.

The gateway imports from here only:

    connect(url) -> redis client          TenantStore(redis).authenticate(key) -> AuthContext | None
    TenancyUnavailable -> 503             QuotaExceeded -> 429 (body(), headers)

Nothing in this package imports the HTTP app (Starlette lives in gateway/admin_routes.py).
"""

from gateway.tenancy.errors import (
    InvalidArgument,
    KeyNotFound,
    QuotaExceeded,
    TenancyError,
    TenancyUnavailable,
    TenantExists,
    TenantNotFound,
)
from gateway.tenancy.redis_conn import connect
from gateway.tenancy.store import AuthContext, KeyInfo, Tenant, TenantStore

__all__ = [
    "AuthContext",
    "InvalidArgument",
    "KeyInfo",
    "KeyNotFound",
    "QuotaExceeded",
    "TenancyError",
    "TenancyUnavailable",
    "Tenant",
    "TenantExists",
    "TenantNotFound",
    "TenantStore",
    "connect",
]
