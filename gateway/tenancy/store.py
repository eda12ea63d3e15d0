"""Tenants and API keys in Redis, and the one call the gateway authenticates with.

Gateway use (one store per process, built in the lifespan from the Redis pool):

    store = TenantStore(redis, prefix="ps")
    auth = await store.authenticate(bearer_token)   # AuthContext | None; raises TenancyUnavailable

(A generation request does not call this: `Admission.admit_key` runs the same
lookup inside its admission script, one round trip for both.)
    if auth is None: -> 401 (unknown, revoked, expired after rotation grace, or tenant suspended)
    AddRequest(priority=auth.priority, tenant_id=auth.tenant_id, weight=auth.weight, cache_salt=auth.cache_salt)

Admin use (the CLI and /admin routes): create/list/show/suspend/resume/delete
tenants, create/list/revoke/rotate keys. Every change is written to the audit
log under the store's `actor`.

Redis layout (P = prefix):

    P:tenants                 set of tenant names
    P:tenant:{name}           hash  id, name, tier, status, created_at, cache_salt, models
                              (models: "*" or ids joined by ","; "" is none; absent, as in
                              tenants written before it, is "*": model_access.py reads it),
                              aliases (JSON {"name": "model id"}: the tenant's own model aliases)
    P:tenant:{name}:keys      set of key ids
    P:key:{key_id}            hash  id, tenant, tenant_id, label, hash, hint, created_at, status, expires_at, rotated_to
    P:keyhash:{sha256}        string key_id (the only path from a key to its record; PEXPIRE'd on rotation)

The plaintext key exists only in `create_key`'s return value. This module
imports nothing from the HTTP app; quota overrides live in `quota_store.py`, admission
in `admission.py`.
"""

from __future__ import annotations

import getpass
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.tenancy import keys
from gateway.tenancy.audit import AuditLog
from gateway.tenancy.errors import InvalidArgument, KeyNotFound, TenantExists, TenantNotFound
from gateway.tenancy.model_access import EVERY_MODEL, ModelAccess
from gateway.tenancy.redis_conn import ping, text, text_dict, unavailable_on_failure
from gateway.tenancy.tiers import DEFAULT_TIER, TIERS, get_tier

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ACTIVE, SUSPENDED, REVOKED = "active", "suspended", "revoked"

_CREATE_TENANT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""

_CREATE_KEY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

# Keys derived inside the script: standalone Redis only (one lookup chain, one round trip).
# Returns only what authentication needs, as one flat array (small replies parse fast):
# {key id, key status, key tenant_id, tenant id, tenant name, tier, tenant status, cache_salt, models}
# (models false when the field is absent: a tenant written before model lists, read as "*"), aliases.
_AUTHENTICATE = """
local kid = redis.call('GET', KEYS[1])
if not kid then return false end
local k = redis.call('HMGET', ARGV[1] .. ':key:' .. kid, 'status', 'tenant_id', 'tenant')
if not k[3] then return false end
local t = redis.call('HMGET', ARGV[1] .. ':tenant:' .. k[3], 'id', 'name', 'tier', 'status', 'cache_salt', 'models',
                     'aliases')
if not t[1] then return false end
return {kid, k[1], k[2], t[1], t[2], t[3], t[4], t[5] or '', t[6] or '*', t[7] or ''}
"""

_DELETE_TENANT = """
local P, name = ARGV[1], ARGV[2]
local tk = P .. ':tenant:' .. name
if redis.call('EXISTS', tk) == 0 then return 0 end
for _, kid in ipairs(redis.call('SMEMBERS', tk .. ':keys')) do
  local h = redis.call('HGET', P .. ':key:' .. kid, 'hash')
  if h then redis.call('DEL', P .. ':keyhash:' .. h) end
  redis.call('DEL', P .. ':key:' .. kid, P .. ':quota:key:' .. kid)
end
for _, model in ipairs(redis.call('SMEMBERS', P .. ':quota:models:' .. name)) do
  redis.call('DEL', P .. ':quota:model:' .. name .. ':' .. model)
end
redis.call('DEL', tk, tk .. ':keys', P .. ':quota:tenant:' .. name, P .. ':quota:models:' .. name)
redis.call('SREM', P .. ':tenants', name)
return 1
"""


@dataclass(frozen=True)
class AuthContext:
    """Who is calling: everything the gateway needs after authentication."""

    tenant_id: str
    tenant: str
    key_id: str
    tier: str
    priority: int
    """Engine priority of the tenant's tier (lower is more urgent)."""
    weight: float
    """Fair-share weight of the tenant's tier."""
    cache_salt: str
    """Per-tenant salt for prefix-cache hashes: tenants never share cached blocks."""
    models: ModelAccess = EVERY_MODEL
    """The models (and adapters) the tenant may use; `model_access.resolve_model` decides with it."""
    aliases: tuple[tuple[str, str], ...] = ()
    """The tenant's own model aliases (name, model id), applied before the operator's global ones."""


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    tier: str
    status: str
    created_at: float
    cache_salt: str
    models: str = "*"
    """The stored model list ("*" for all, "" for none): `ModelAccess.parse(models)`."""
    aliases: str = ""
    """The stored aliases: JSON {"name": "model id"} ("" for none): `parse_aliases(aliases)`."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "models": ModelAccess.parse(self.models).shown(),
                "aliases": dict(parse_aliases(self.aliases))}


def parse_aliases(raw: str | None) -> tuple[tuple[str, str], ...]:
    """The stored JSON object as sorted (name, model id) pairs; anything else (hand-edited) is no alias."""
    try:
        data = json.loads(raw or "{}")
    except ValueError:
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in data.items() if k and v))


@dataclass(frozen=True)
class KeyInfo:
    """A key's record, never its plaintext; `hint` is "ps-...abcd"."""

    id: str
    tenant: str
    tenant_id: str
    label: str
    hint: str
    created_at: float
    status: str
    """"active" or "revoked"; a rotated key stays "active" until `expires_at`."""
    expires_at: float | None
    rotated_to: str | None

    def usable(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.status == ACTIVE and (self.expires_at is None or self.expires_at > now)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable()}


def auth_context(key_id: str, tenant_id: str, tenant: str, tier_name: str, cache_salt: str,
                 models: str | None = None, aliases: str | None = None) -> AuthContext:
    """The context of an authenticated key (an unknown tier name gets the default tier)."""
    tier = TIERS.get(tier_name, TIERS[DEFAULT_TIER])
    # A record without a salt (written before salts existed, or edited by hand) must not share the
    # unsalted prefix cache with every other such tenant: its unique id salts it instead.
    salt = cache_salt or f"tenant-id:{tenant_id}"
    return AuthContext(tenant_id=tenant_id, tenant=tenant, key_id=key_id, tier=tier.name,
                       priority=tier.priority, weight=tier.weight, cache_salt=salt,
                       models=ModelAccess.parse(models), aliases=parse_aliases(aliases))


def _tenant(raw: dict[str, str]) -> Tenant:
    return Tenant(id=raw["id"], name=raw["name"], tier=raw["tier"], status=raw["status"],
                  created_at=float(raw["created_at"]), cache_salt=raw.get("cache_salt", ""),
                  models=ModelAccess.parse(raw.get("models")).encode(), aliases=raw.get("aliases", ""))


def _key(raw: dict[str, str]) -> KeyInfo:
    return KeyInfo(id=raw["id"], tenant=raw["tenant"], tenant_id=raw["tenant_id"], label=raw.get("label", ""),
                   hint=raw.get("hint", ""), created_at=float(raw["created_at"]), status=raw["status"],
                   expires_at=float(raw["expires_at"]) if raw.get("expires_at") else None,
                   rotated_to=raw.get("rotated_to") or None)


def default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no passwd entry in some containers
        return "cli"


class TenantStore:
    def __init__(self, client: aioredis.Redis, prefix: str = "ps", actor: str | None = None) -> None:
        self.redis = client
        self.prefix = prefix
        self.actor = actor or default_actor()
        self.audit = AuditLog(client, prefix)
        self._create_tenant = client.register_script(_CREATE_TENANT)
        self._create_key = client.register_script(_CREATE_KEY)
        self._authenticate = client.register_script(_AUTHENTICATE)
        self._delete_tenant = client.register_script(_DELETE_TENANT)

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def ping(self) -> bool:
        """True when Redis answers (for /health); never raises."""
        return await ping(self.redis)

    # -- authentication (the gateway's hot path) ---------------------------------

    async def authenticate(self, plaintext: str) -> AuthContext | None:
        """The caller behind a bearer key, or None if it must get 401.

        None for: a malformed or unknown key, a revoked key, a rotated key
        whose grace period is over, a suspended or deleted tenant. Raises
        TenancyUnavailable (-> 503) when Redis cannot be reached.
        """
        if not keys.looks_like_key(plaintext):
            return None
        with unavailable_on_failure():
            found = await self._authenticate(keys=[self._k("keyhash", keys.hash_key(plaintext))],
                                             args=[self.prefix])
        if not found:
            return None
        key_id, key_status, key_tenant_id, tenant_id, name, tier_name, status, salt, models, aliases = (
            text(x) for x in found)
        if key_status != ACTIVE or status != ACTIVE:
            return None
        if tenant_id != key_tenant_id:
            return None  # the tenant was deleted and a new one took the name
        return auth_context(key_id, tenant_id, name, tier_name, salt, models, aliases)

    # -- tenants -----------------------------------------------------------------

    async def create_tenant(self, name: str, tier: str = DEFAULT_TIER, models: ModelAccess = EVERY_MODEL) -> Tenant:
        """Raises TenantExists, or InvalidArgument for a bad name or tier. Every model unless `models` says."""
        if not NAME_RE.match(name):
            raise InvalidArgument(f"tenant name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
        get_tier(tier)
        tenant = Tenant(id="t_" + secrets.token_hex(8), name=name, tier=tier, status=ACTIVE,
                        created_at=time.time(), cache_salt=secrets.token_hex(16), models=models.encode())
        flat = [x for k, v in asdict(tenant).items() for x in (k, str(v))]
        with unavailable_on_failure():
            created = await self._create_tenant(keys=[self._k("tenant", name), self._k("tenants")],
                                                args=[name, *flat])
        if not created:
            raise TenantExists(name)
        await self.audit.record(self.actor, "tenant.create", name, tier=tier, tenant_id=tenant.id,
                                models=models.encode())
        return tenant

    async def set_models(self, name: str, models: ModelAccess) -> Tenant:
        """Replace the tenant's model list; every gateway applies it from the tenant's next request."""
        await self.get_tenant(name)
        with unavailable_on_failure():
            await self.redis.hset(self._k("tenant", name), "models", models.encode())
        await self.audit.record(self.actor, "tenant.models", name, models=models.encode())
        return await self.get_tenant(name)

    async def set_aliases(self, name: str, aliases: dict[str, str]) -> Tenant:
        """Replace the tenant's own model aliases (name -> model id; {} removes them)."""
        await self.get_tenant(name)
        with unavailable_on_failure():
            await self.redis.hset(self._k("tenant", name), "aliases", json.dumps(aliases, sort_keys=True))
        await self.audit.record(self.actor, "tenant.aliases", name, aliases=json.dumps(aliases, sort_keys=True))
        return await self.get_tenant(name)

    async def get_tenant(self, name: str) -> Tenant:
        with unavailable_on_failure():
            raw = text_dict(await self.redis.hgetall(self._k("tenant", name)))
        if not raw:
            raise TenantNotFound(name)
        return _tenant(raw)

    async def list_tenants(self) -> list[Tenant]:
        with unavailable_on_failure():
            names = sorted(text(n) for n in await self.redis.smembers(self._k("tenants")))
            async with self.redis.pipeline(transaction=False) as pipe:
                for n in names:
                    pipe.hgetall(self._k("tenant", n))
                rows = await pipe.execute()
        return [_tenant(text_dict(r)) for r in rows if r]

    async def suspend_tenant(self, name: str) -> Tenant:
        """Every key of the tenant stops authenticating with the next request."""
        return await self._set_status(name, SUSPENDED, "tenant.suspend")

    async def resume_tenant(self, name: str) -> Tenant:
        return await self._set_status(name, ACTIVE, "tenant.resume")

    async def _set_status(self, name: str, status: str, action: str) -> Tenant:
        await self.get_tenant(name)
        with unavailable_on_failure():
            await self.redis.hset(self._k("tenant", name), "status", status)
        await self.audit.record(self.actor, action, name)
        return await self.get_tenant(name)

    async def delete_tenant(self, name: str) -> None:
        """Removes the tenant, its keys and its quota overrides; its usage history stays."""
        with unavailable_on_failure():
            deleted = await self._delete_tenant(args=[self.prefix, name])
        if not deleted:
            raise TenantNotFound(name)
        await self.audit.record(self.actor, "tenant.delete", name)

    # -- keys --------------------------------------------------------------------

    async def create_key(self, tenant_name: str, label: str | None = None) -> tuple[str, KeyInfo]:
        """A new key for the tenant: (plaintext shown once, its record). Raises TenantNotFound."""
        tenant = await self.get_tenant(tenant_name)
        plaintext = keys.new_key()
        info = KeyInfo(id="key_" + secrets.token_hex(8), tenant=tenant.name, tenant_id=tenant.id,
                       label=label or "", hint=keys.key_hint(plaintext), created_at=time.time(),
                       status=ACTIVE, expires_at=None, rotated_to=None)
        record = {k: ("" if v is None else str(v)) for k, v in asdict(info).items()}
        record["hash"] = keys.hash_key(plaintext)
        flat = [x for k, v in record.items() for x in (k, v)]
        with unavailable_on_failure():
            created = await self._create_key(
                keys=[self._k("tenant", tenant.name), self._k("key", info.id),
                      self._k("keyhash", record["hash"]), self._k("tenant", tenant.name, "keys")],
                args=[info.id, *flat])
        if not created:
            raise TenantNotFound(tenant_name)
        await self.audit.record(self.actor, "key.create", info.id, tenant=tenant.name, label=info.label)
        return plaintext, info

    async def get_key(self, key_id: str) -> KeyInfo:
        with unavailable_on_failure():
            raw = text_dict(await self.redis.hgetall(self._k("key", key_id)))
        if not raw:
            raise KeyNotFound(key_id)
        return _key(raw)

    async def list_keys(self, tenant_name: str) -> list[KeyInfo]:
        await self.get_tenant(tenant_name)
        with unavailable_on_failure():
            ids = sorted(text(i) for i in await self.redis.smembers(self._k("tenant", tenant_name, "keys")))
            async with self.redis.pipeline(transaction=False) as pipe:
                for key_id in ids:
                    pipe.hgetall(self._k("key", key_id))
                rows = await pipe.execute()
        return sorted((_key(text_dict(r)) for r in rows if r), key=lambda k: k.created_at)

    async def revoke_key(self, key_id: str) -> KeyInfo:
        """The key stops authenticating at once."""
        info = await self.get_key(key_id)
        with unavailable_on_failure():
            key_hash = await self.redis.hget(self._k("key", key_id), "hash")
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._k("key", key_id), "status", REVOKED)
                if key_hash:
                    pipe.delete(self._k("keyhash", text(key_hash)))
                await pipe.execute()
        await self.audit.record(self.actor, "key.revoke", key_id, tenant=info.tenant)
        return await self.get_key(key_id)

    async def rotate_key(self, key_id: str, grace_s: float = 3600.0) -> tuple[str, KeyInfo]:
        """A new key for the same tenant and label; the old one keeps working for `grace_s` seconds.

        Redis expires the old key's lookup entry itself, so every gateway stops
        accepting it at the same moment. grace_s=0 revokes the old key at once.
        """
        if grace_s < 0:
            raise InvalidArgument(f"grace must be >= 0 seconds, got {grace_s}")
        old = await self.get_key(key_id)
        if not old.usable():
            raise InvalidArgument(f"API key {key_id!r} is revoked or expired; create a new key instead")
        plaintext, new = await self.create_key(old.tenant, old.label)
        if grace_s == 0:
            await self.revoke_key(key_id)
        else:
            with unavailable_on_failure():
                key_hash = text(await self.redis.hget(self._k("key", key_id), "hash"))
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.pexpire(self._k("keyhash", key_hash), max(1, int(grace_s * 1000)))
                    pipe.hset(self._k("key", key_id), mapping={"expires_at": repr(time.time() + grace_s),
                                                               "rotated_to": new.id})
                    await pipe.execute()
        await self.audit.record(self.actor, "key.rotate", key_id, new_key_id=new.id, grace_s=grace_s)
        return plaintext, new
