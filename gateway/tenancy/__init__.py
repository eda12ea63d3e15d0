"""Multi-tenancy in Redis: tenants, hashed API keys, quotas, admission and usage.

The gateway imports from here only:

    connect(url) -> redis client          TenantStore(redis).authenticate(key) -> AuthContext | None
    Admission(redis).admit_key(key, prompt_tokens, max_tokens) -> (AuthContext, Ticket) | None
        (authentication and admission in one round trip; Ticket: headers, settle(...))
    Admission(redis).admit(auth, prompt_tokens, max_tokens) -> Ticket (a caller authenticated already)
    TenancyUnavailable -> 503             QuotaExceeded -> 429 (body(), headers)

Which model a tenant's requested name means (or 404) is `model_access.resolve_model`, pure: every
route asks it (through gateway/served_models.py). Admin operations (CLI and /admin routes) go through
`admin_ops.AdminOps`.
Admission's scripts run over one pipelined connection per process
(`script_channel.py`); everything else uses the redis-py client.
Redis is the only state; admission fails closed when it is unreachable (there
is no local fallback: authentication needs Redis too).

Nothing in this package imports the HTTP app (Starlette lives in gateway/admin_routes.py).
"""

from gateway.tenancy.admission import Admission, AdmissionConfig, Settlement, Ticket
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
    "Admission",
    "AdmissionConfig",
    "Settlement",
    "Ticket",
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
