"""Keys verified in the last few seconds, by hash: the key check before the body costs no round trip for them.

A generation request's key is checked before its body is read (`gateway/auth.py`),
and checked again, atomically with its quotas, by the admission script. The
first check only guards the gateway's own work (reading, parsing, templating,
tokenizing), so a key that passed it a moment ago may skip it: the admission
script still refuses a key revoked since. Only sha256 hashes are held, never
keys, each with the caller's context it verified to (its model list decides
which model a request may name before admission; admission returns the fresh
context and the route decides again with it). The table is bounded and
entries expire after `ttl_s`.
It knows nothing about HTTP or Redis.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.tenancy.keys import hash_key
from gateway.tenancy.store import AuthContext


class RecentKeys:
    def __init__(self, ttl_s: float = 5.0, capacity: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._expiry: OrderedDict[str, float] = OrderedDict()
        self._auth: dict[str, AuthContext] = {}

    def seen(self, key: str) -> bool:
        """True when `key` was verified less than ttl_s ago."""
        return self.get(key) is not None

    def get(self, key: str) -> AuthContext | None:
        """The context `key` verified to less than ttl_s ago, or None."""
        digest = hash_key(key)
        expiry = self._expiry.get(digest)
        if expiry is None:
            return None
        if expiry <= self._clock():
            del self._expiry[digest]
            self._auth.pop(digest, None)
            return None
        return self._auth.get(digest)

    def add(self, key: str, auth: AuthContext) -> None:
        digest = hash_key(key)
        self._expiry[digest] = self._clock() + self.ttl_s
        self._auth[digest] = auth
        self._expiry.move_to_end(digest)
        while len(self._expiry) > self._capacity:
            self._auth.pop(self._expiry.popitem(last=False)[0], None)
