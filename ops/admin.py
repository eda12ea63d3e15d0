"""`pageserve admin`: manage tenants, keys, quotas and usage by talking to Redis directly.

Works while the gateway is down: it needs only `--redis-url` (or
$PAGESERVE_REDIS_URL) and the key prefix the gateway uses (`--prefix`,
$PAGESERVE_REDIS_PREFIX, default "ps"). Every change lands in the audit log.

    pageserve admin tenant create NAME [--tier free|standard|premium] [--models A,B]   # default: every model (*)
    pageserve admin tenant list|show NAME|suspend NAME|resume NAME|delete NAME
    pageserve admin tenant models NAME [--allow MODEL ... | --all | --none]   # no option: show the list
    pageserve admin tenant aliases NAME [--set ALIAS=MODEL ...] [--unset ALIAS ...]   # the tenant's own
    pageserve admin key create TENANT [--label L]      # prints the key once
    pageserve admin key list TENANT | revoke KEY_ID | rotate KEY_ID [--grace SECONDS]
    pageserve admin quota set TENANT [--key KEY_ID | --model MODEL] [--rpm N] [--input-tpm N] ... (N | unlimited | default)
    pageserve admin quota show TENANT [--key KEY_ID | --model MODEL]
    pageserve admin usage show [TENANT [--by-key | --by-model]] [--key KEY_ID] [--since DATE] [--until DATE] [--json]
    pageserve admin audit show [--limit N]
    pageserve admin install-units [--root DIR] [--memory-max 24G]   # systemd units (ops/units.py)
    pageserve admin lora load NAME PATH | unload NAME   # through the gateway's admin routes (ops/admin_lora.py)

Exit status: 0 done, 1 refused (unknown tenant, duplicate, bad value), 2 usage
error, 3 Redis unreachable. A plaintext key is printed only by `key create`
and `key rotate`, once, on stdout; nothing is logged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.tenancy import TenancyError, TenancyUnavailable, TenantStore, connect
from gateway.tenancy.admin_ops import AdminOps, OpResult
from gateway.tenancy.quota import LIMIT_FIELDS, LIMIT_HELP
from gateway.tenancy.tiers import DEFAULT_TIER, TIERS

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _common(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS so that a leaf parser never overwrites a value given before the subcommand.
    parser.add_argument("--redis-url", default=argparse.SUPPRESS, help="Redis URL ($PAGESERVE_REDIS_URL)")
    parser.add_argument("--prefix", default=argparse.SUPPRESS, help="Redis key prefix ($PAGESERVE_REDIS_PREFIX)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")


def _tenant_commands(tenant: Any, leaf: Callable[[Any, str, str], argparse.ArgumentParser]) -> None:
    p = leaf(tenant, "create", "create a tenant")
    p.add_argument("name")
    p.add_argument("--tier", default=DEFAULT_TIER, choices=sorted(TIERS))
    p.add_argument("--models", default=None, help="comma-separated model ids it may use ('' for none); "
                   "default: every model (*)")
    leaf(tenant, "list", "list tenants")
    p = leaf(tenant, "models", "show or replace the models a tenant may use")
    p.add_argument("name")
    p.add_argument("--allow", action="append", default=None, metavar="MODEL", help="a model id (repeatable)")
    p.add_argument("--all", dest="every", action="store_true", help="every model, now and later (*)")
    p.add_argument("--none", action="store_true", help="no model")
    p = leaf(tenant, "aliases", "show or change the tenant's own model aliases (before the gateway's)")
    p.add_argument("name")
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="ALIAS=MODEL")
    p.add_argument("--unset", action="append", default=[], metavar="ALIAS")
    for cmd in ("show", "suspend", "resume", "delete"):
        leaf(tenant, cmd, f"{cmd} a tenant").add_argument("name")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pageserve admin", description=__doc__.split("\n\n")[0])
    _common(parser)
    groups = parser.add_subparsers(dest="group", required=True)

    def leaf(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        _common(p)
        return p

    _tenant_commands(groups.add_parser("tenant", help="tenants").add_subparsers(dest="cmd", required=True), leaf)

    key = groups.add_parser("key", help="API keys").add_subparsers(dest="cmd", required=True)
    p = leaf(key, "create", "create a key (printed once)")
    p.add_argument("tenant")
    p.add_argument("--label", default=None)
    leaf(key, "list", "list a tenant's keys").add_argument("tenant")
    leaf(key, "revoke", "revoke a key at once").add_argument("key_id")
    p = leaf(key, "rotate", "replace a key; the old one works for --grace seconds")
    p.add_argument("key_id")
    p.add_argument("--grace", type=float, default=3600.0, help="seconds the old key stays valid (default 3600)")

    quota = groups.add_parser("quota", help="limits").add_subparsers(dest="cmd", required=True)
    p = leaf(quota, "set", "override limits: N, 'unlimited', or 'default' (the tier's value; for a key: none)")
    p.add_argument("tenant")
    p.add_argument("--key", dest="key_id", default=None, help="set the key's own limits")
    p.add_argument("--model", default=None, help="set the tenant's limits on this model id")
    for field in LIMIT_FIELDS:
        p.add_argument("--" + field.replace("_", "-"), dest=field, default=None, metavar="N", help=LIMIT_HELP[field])
    p = leaf(quota, "show", "effective limits")
    p.add_argument("tenant")
    p.add_argument("--key", dest="key_id", default=None)
    p.add_argument("--model", default=None)

    usage = groups.add_parser("usage", help="usage").add_subparsers(dest="cmd", required=True)
    p = leaf(usage, "show", "usage per day")
    p.add_argument("tenant", nargs="?", default=None)
    p.add_argument("--key", dest="key_id", default=None, help="one key's usage")
    p.add_argument("--by-key", action="store_true", help="a row per key of TENANT")
    p.add_argument("--by-model", action="store_true", help="a row per model TENANT used")
    p.add_argument("--since", default=None, help="first UTC day, YYYY-MM-DD (default: 30 days ago)")
    p.add_argument("--until", default=None, help="last UTC day, YYYY-MM-DD (default: today)")

    audit = groups.add_parser("audit", help="audit log").add_subparsers(dest="cmd", required=True)
    p = leaf(audit, "show", "the newest admin changes")
    p.add_argument("--limit", type=int, default=50)
    return parser


def _dispatch(ops: AdminOps, a: argparse.Namespace) -> Callable[[], Awaitable[OpResult]]:
    table: dict[tuple[str, str], Callable[[], Awaitable[OpResult]]] = {
        ("tenant", "create"): lambda: ops.tenant_create(
            a.name, a.tier, None if a.models is None else a.models.split(",")),
        ("tenant", "models"): lambda: ops.tenant_models(a.name, a.allow, a.every, a.none),
        ("tenant", "aliases"): lambda: ops.tenant_aliases(a.name, a.set_, a.unset),
        ("tenant", "list"): ops.tenant_list,
        ("tenant", "show"): lambda: ops.tenant_show(a.name),
        ("tenant", "suspend"): lambda: ops.tenant_suspend(a.name),
        ("tenant", "resume"): lambda: ops.tenant_resume(a.name),
        ("tenant", "delete"): lambda: ops.tenant_delete(a.name),
        ("key", "create"): lambda: ops.key_create(a.tenant, a.label),
        ("key", "list"): lambda: ops.key_list(a.tenant),
        ("key", "revoke"): lambda: ops.key_revoke(a.key_id),
        ("key", "rotate"): lambda: ops.key_rotate(a.key_id, a.grace),
        ("quota", "set"): lambda: ops.quota_set(
            a.tenant, a.key_id, {f: getattr(a, f) for f in LIMIT_FIELDS if getattr(a, f) is not None}, a.model),
        ("quota", "show"): lambda: ops.quota_show(a.tenant, a.key_id, a.model),
        ("usage", "show"): lambda: ops.usage_show(a.tenant, a.key_id, a.since, a.until, a.by_key, a.by_model),
        ("audit", "show"): lambda: ops.audit_show(a.limit),
    }
    return table[(a.group, a.cmd)]


async def _run(a: argparse.Namespace) -> int:
    client = connect(a.redis_url, timeout_s=2.0)
    try:
        ops = AdminOps(TenantStore(client, a.prefix))
        result = await _dispatch(ops, a)()
    finally:
        await client.aclose()
    if a.json:
        print(json.dumps(result.data, indent=2, sort_keys=True))
    else:
        print(result.text)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["install-units"]:  # needs no Redis: systemd units and env files (ops/units.py)
        from ops.units import main as install_units

        return install_units(argv[1:])
    if argv[:1] == ["lora"]:  # adapters live in the engines: through the gateway, not Redis (ops/admin_lora.py)
        from ops.admin_lora import main as lora

        return lora(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    args.redis_url = getattr(args, "redis_url", None) or os.environ.get("PAGESERVE_REDIS_URL", DEFAULT_REDIS_URL)
    args.prefix = getattr(args, "prefix", None) or os.environ.get("PAGESERVE_REDIS_PREFIX", "ps")
    args.json = getattr(args, "json", False)
    try:
        return asyncio.run(_run(args))
    except TenancyUnavailable as exc:
        print(f"pageserve admin: {exc.message} at {_safe_url(args.redis_url)}", file=sys.stderr)
        return 3
    except TenancyError as exc:
        print(f"pageserve admin: {exc}", file=sys.stderr)
        return 1


def _safe_url(url: str) -> str:
    """The Redis URL without any password in it."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"
