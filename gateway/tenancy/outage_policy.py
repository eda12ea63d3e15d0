"""What a gateway does with a request while Redis is unreachable: refuse it (the default) or, for
tenants an operator chose, serve it without quotas.

    policy = OutagePolicy(fail_open=frozenset({"acme"}))
    policy.remember(key, auth)                 # after every successful admission
    auth = policy.during_outage(key)           # Redis down: the remembered caller of a fail-open
                                               #   tenant, else TenancyUnavailable (a 503)

Fail closed is the default because Redis holds everything that makes a key valid: during an
outage no revocation, suspension or quota can be read. A fail-open tenant trades that for
availability: a key admitted in the last `remember_s` keeps working for that tenant, its requests
run without a reservation or lease, and their usage is only in the gateway's per-request log lines
(not in Redis). Every refusal and every fail-open admission is logged (tenant, never the key).
Keys are remembered only as their SHA-256 hash. Knows nothing about HTTP.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field

from gateway.tenancy import keys
from gateway.tenancy.errors import TenancyUnavailable
from gateway.tenancy.store import AuthContext

log = logging.getLogger("pageserve.tenancy")


@dataclass
class OutagePolicy:
    fail_open: frozenset[str] = frozenset()
    """Tenant names served without quotas while Redis is down; empty: fail closed for everyone."""
    remember_s: float = 300.0
    """How long after its last admission a key still counts as valid during an outage."""
    max_remembered: int = 10_000
    _seen: collections.OrderedDict[str, tuple[AuthContext, float]] = field(default_factory=collections.OrderedDict)

    def remember(self, key: str, auth: AuthContext) -> None:
        if auth.tenant not in self.fail_open:
            return
        digest = keys.hash_key(key)
        self._seen[digest] = (auth, time.monotonic())
        self._seen.move_to_end(digest)
        while len(self._seen) > self.max_remembered:
            self._seen.popitem(last=False)

    def during_outage(self, key: str, error: TenancyUnavailable) -> AuthContext:
        """The caller to serve without quotas, or `error` re-raised (logged either way)."""
        seen = self._seen.get(keys.hash_key(key)) if self.fail_open else None
        if seen is not None and time.monotonic() - seen[1] <= self.remember_s:
            log.warning("Redis unavailable: serving tenant %s without quotas (fail-open policy)", seen[0].tenant)
            return seen[0]
        log.warning("Redis unavailable: refused a request (fail-closed policy): %s", error.message)
        raise error
