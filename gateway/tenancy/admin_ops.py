"""Admin operations, once, for both front ends: the `pageserve admin` CLI and the `/admin` HTTP routes.

Each operation returns an `OpResult`: JSON-ready `data` (what `--json` and the
HTTP routes emit) and a short human `text`. A plaintext key appears only in the
result of `key_create` / `key_rotate` (field "key"), which both front ends show
exactly once; no operation logs anything. Errors are the typed tenancy errors.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from gateway.tenancy.errors import InvalidArgument
from gateway.tenancy.model_access import EVERY_MODEL, ModelAccess
from gateway.tenancy.quota import LIMIT_FIELDS, parse_limit
from gateway.tenancy.quota_store import QuotaStore
from gateway.tenancy.store import KeyInfo, Tenant, TenantStore, parse_aliases
from gateway.tenancy.usage import UsageReader, UsageRow


@dataclass(frozen=True)
class OpResult:
    data: Any
    text: str


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _tenant_line(t: Tenant) -> str:
    return f"{t.name:<20} {t.tier:<9} {t.status:<10} {t.id}  created {_when(t.created_at)}"


def _key_line(k: KeyInfo) -> str:
    state = "usable" if k.usable() else ("revoked" if k.status == "revoked" else "expired")
    expiry = f" expires {_when(k.expires_at)}" if k.expires_at else ""
    return f"{k.id:<22} {k.hint:<12} {state:<8} label={k.label or '-'}{expiry}"


def _parse_day(text: str | None, default: dt.date) -> dt.date:
    if text is None:
        return default
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"expected a date YYYY-MM-DD, got {text!r}") from None


class AdminOps:
    def __init__(self, store: TenantStore) -> None:
        self.store = store
        self.quotas = QuotaStore(store)
        self.usage = UsageReader(store.redis, store.prefix)

    # -- tenants -----------------------------------------------------------------

    async def tenant_create(self, name: str, tier: str, models: list[str] | None = None) -> OpResult:
        """models: None for every model ("*"); a list (possibly empty: none) otherwise."""
        access = EVERY_MODEL if models is None else ModelAccess.of(models)
        t = await self.store.create_tenant(name, tier, access)
        return OpResult(t.to_dict(), f"created tenant {t.name} (tier {t.tier}, id {t.id}, "
                                     f"models {_models(access)})")

    async def tenant_aliases(self, name: str, set_: list[str], unset: list[str]) -> OpResult:
        """Add (--set NAME=MODEL) or drop (--unset NAME) the tenant's own aliases; nothing given shows them."""
        aliases = dict(parse_aliases((await self.store.get_tenant(name)).aliases))
        for pair in set_:
            alias, sep, model = (x.strip() for x in pair.partition("="))
            if not sep or not alias or not model:
                raise InvalidArgument(f"--set expects NAME=MODEL, got {pair!r}")
            aliases[alias] = model
        for alias in unset:
            aliases.pop(alias, None)
        if set_ or unset:
            await self.store.set_aliases(name, aliases)
        text = "\n".join(f"  {a} -> {m}" for a, m in sorted(aliases.items())) or "  none"
        return OpResult({"tenant": name, "aliases": aliases}, f"model aliases of tenant {name}:\n{text}")

    async def tenant_models(self, name: str, allow: list[str] | None, every: bool, none: bool) -> OpResult:
        """Replace the model list: --allow A --allow B, --all ("*"), or --none; nothing given shows it."""
        if sum((bool(allow), every, none)) > 1:
            raise InvalidArgument("give --allow MODEL (repeatable), --all or --none, not several")
        if allow or every or none:
            access = EVERY_MODEL if every else ModelAccess.of(allow or [])
            t = await self.store.set_models(name, access)
        else:
            t = await self.store.get_tenant(name)
        access = ModelAccess.parse(t.models)
        return OpResult({"tenant": name, "models": access.shown()}, f"tenant {name} may use {_models(access)}")

    async def tenant_list(self) -> OpResult:
        tenants = await self.store.list_tenants()
        return OpResult([t.to_dict() for t in tenants], "\n".join(map(_tenant_line, tenants)) or "no tenants")

    async def tenant_show(self, name: str) -> OpResult:
        t = await self.store.get_tenant(name)
        keys = await self.store.list_keys(name)
        quota = await self.quotas.effective(name)
        data = {**t.to_dict(), "keys": [k.to_dict() for k in keys], "quota": quota.to_dict()}
        lines = [_tenant_line(t), "keys:", *("  " + _key_line(k) for k in keys), "limits:"]
        lines += [f"  {f:<15} {_limit(v)}" for f, v in quota.to_dict().items()]
        return OpResult(data, "\n".join(lines))

    async def tenant_suspend(self, name: str) -> OpResult:
        t = await self.store.suspend_tenant(name)
        return OpResult(t.to_dict(), f"suspended tenant {name}: its keys are refused from now on")

    async def tenant_resume(self, name: str) -> OpResult:
        t = await self.store.resume_tenant(name)
        return OpResult(t.to_dict(), f"resumed tenant {name}")

    async def tenant_delete(self, name: str) -> OpResult:
        await self.store.delete_tenant(name)
        return OpResult({"deleted": name}, f"deleted tenant {name} and its keys (usage history kept)")

    # -- keys --------------------------------------------------------------------

    async def key_create(self, tenant: str, label: str | None) -> OpResult:
        plaintext, k = await self.store.create_key(tenant, label)
        text = (f"created key {k.id} for tenant {tenant}\n{plaintext}\n"
                "store it now: it is shown only this once")
        return OpResult({**k.to_dict(), "key": plaintext}, text)

    async def key_list(self, tenant: str) -> OpResult:
        keys = await self.store.list_keys(tenant)
        return OpResult([k.to_dict() for k in keys], "\n".join(map(_key_line, keys)) or "no keys")

    async def key_revoke(self, key_id: str) -> OpResult:
        k = await self.store.revoke_key(key_id)
        return OpResult(k.to_dict(), f"revoked key {k.id} ({k.hint}) of tenant {k.tenant}")

    async def key_rotate(self, key_id: str, grace_s: float) -> OpResult:
        plaintext, k = await self.store.rotate_key(key_id, grace_s)
        text = (f"created key {k.id} replacing {key_id}, which stays valid for {grace_s:g} s\n{plaintext}\n"
                "store it now: it is shown only this once")
        return OpResult({**k.to_dict(), "key": plaintext, "replaces": key_id, "grace_s": grace_s}, text)

    # -- quotas ------------------------------------------------------------------

    async def quota_set(self, tenant: str, key_id: str | None, changes: dict[str, str],
                        model: str | None = None) -> OpResult:
        if not changes:
            raise InvalidArgument(f"nothing to set: give at least one of --{', --'.join(LIMIT_FIELDS)}")
        parsed = {f: parse_limit(f, v) for f, v in changes.items()}
        await self.quotas.set(tenant, key_id, parsed, model)
        return await self.quota_show(tenant, key_id, model)

    async def quota_show(self, tenant: str, key_id: str | None, model: str | None = None) -> OpResult:
        effective = await self.quotas.effective(tenant, key_id, model)
        overrides = await self.quotas.overrides(tenant, key_id, model)
        scope = f"key {key_id}" if key_id else f"tenant {tenant} on model {model}" if model else f"tenant {tenant}"
        lines = [f"limits of {scope} (* = set explicitly):"]
        lines += [f"  {f:<15} {_limit(v)}{' *' if f in overrides else ''}" for f, v in effective.to_dict().items()]
        return OpResult({"scope": scope, "limits": effective.to_dict(), "overrides": sorted(overrides)},
                        "\n".join(lines))

    # -- usage and audit -----------------------------------------------------------

    async def usage_show(self, tenant: str | None, key_id: str | None, since: str | None,
                         until: str | None, by_key: bool = False, by_model: bool = False) -> OpResult:
        """Per day; per tenant (all tenants by default), one key (key_id), or each key of a tenant (by_key)."""
        today = dt.datetime.now(dt.UTC).date()
        last = _parse_day(until, today)
        first = _parse_day(since, last - dt.timedelta(days=29))
        if first > last:
            raise InvalidArgument(f"--since {first} is after --until {last}")
        if (last - first).days > 3660:
            raise InvalidArgument("the range is limited to ten years")
        if by_model:
            if tenant is None or key_id is not None or by_key:
                raise InvalidArgument("--by-model needs a tenant, and neither --key nor --by-key")
            await self.store.get_tenant(tenant)
            rows = await self.usage.read_models(tenant, first, last)
        elif key_id is not None or by_key:
            if key_id is not None:
                owners = {key_id: (await self.store.get_key(key_id)).tenant}
            elif tenant is None:
                raise InvalidArgument("--by-key needs a tenant")
            else:
                owners = {k.id: tenant for k in await self.store.list_keys(tenant)}
            rows = await self.usage.read("key", list(owners), first, last)
            rows = [UsageRow(**{**r.to_dict(), "tenant": owners[r.key_id or ""]}) for r in rows]
        else:
            names = [tenant] if tenant else [t.name for t in await self.store.list_tenants()]
            rows = await self.usage.read("tenant", names, first, last)
        lines = [f"{'day':<11} {'tenant':<16} {'key / model':<22} {'req':>6} {'prompt':>9} {'cached':>9} "
                 f"{'completion':>10} {'errors':>6}"]
        lines += [f"{r.day:<11} {r.tenant:<16} {r.key_id or r.model or '-':<22} {r.requests:>6} {r.prompt_tokens:>9} "
                  f"{r.cached_tokens:>9} {r.completion_tokens:>10} {r.errors:>6}" for r in rows]
        data = {"since": first.isoformat(), "until": last.isoformat(), "rows": [r.to_dict() for r in rows]}
        return OpResult(data, "\n".join(lines) if rows else f"no usage from {first} to {last}")

    async def audit_show(self, limit: int) -> OpResult:
        if limit <= 0:
            raise InvalidArgument(f"--limit must be positive, got {limit}")
        entries = await self.store.audit.read(limit)
        lines = [f"{_when(e.at)}  {e.actor:<16} {e.action:<15} {e.target}  "
                 f"{' '.join(f'{k}={v}' for k, v in sorted(e.details.items()))}" for e in entries]
        return OpResult([e.to_dict() for e in entries], "\n".join(lines) or "audit log is empty")


def _models(access: ModelAccess) -> str:
    return "every model (*)" if access.everything else ", ".join(access.shown()) or "no model"


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)
