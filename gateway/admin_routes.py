"""`/admin/...`: the `pageserve admin` operations over HTTP, guarded by one admin token.

    GET    /admin/tenants                          list tenants
    POST   /admin/tenants                          {"name", "tier"?}            -> 201
    GET    /admin/tenants/{name}                   tenant, keys (hints only), limits
    DELETE /admin/tenants/{name}
    POST   /admin/tenants/{name}/suspend | resume
    GET    /admin/tenants/{name}/keys
    POST   /admin/tenants/{name}/keys              {"label"?}                   -> 201, the key, once
    POST   /admin/keys/{key_id}/revoke
    POST   /admin/keys/{key_id}/rotate             {"grace_s"?: 3600}           -> the new key, once
    GET    /admin/tenants/{name}/quota[?key=KEY_ID]
    PUT    /admin/tenants/{name}/quota             {"key_id"?, "limits": {"rpm": 60 | "unlimited" | "default", ...}}
    GET    /admin/usage[?tenant=&key=&by_key=1&since=YYYY-MM-DD&until=YYYY-MM-DD]
    GET    /admin/audit[?limit=50]

The token (`PAGESERVE_ADMIN_TOKEN`, or the gateway's config) is sent as
`Authorization: Bearer <token>` and compared in constant time; without a
configured token every admin route answers 404. Each operation is the same
`AdminOps` call the CLI makes, audited under the actor "admin-api". Keys appear
only in the create and rotate responses (with `Cache-Control: no-store`),
never in errors or logs.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from gateway.errors import APIError, AuthenticationError, InvalidRequest, NotFound, ServiceUnavailable
from gateway.tenancy.admin_ops import AdminOps, OpResult
from gateway.tenancy.errors import (
    InvalidArgument,
    KeyNotFound,
    TenancyError,
    TenancyUnavailable,
    TenantExists,
    TenantNotFound,
)
from gateway.tenancy.store import TenantStore
from gateway.tenancy.tiers import DEFAULT_TIER

StoreGetter = Callable[[Request], TenantStore]
Handler = Callable[[Request, AdminOps], Awaitable[OpResult]]
ACTOR = "admin-api"


def _gateway_store(request: Request) -> TenantStore:
    from gateway.state import get_state

    store = get_state(request).store
    assert isinstance(store, TenantStore)
    return store


def _api_error(exc: TenancyError) -> APIError:
    if isinstance(exc, TenancyUnavailable):
        return ServiceUnavailable(exc.message, code="service_unavailable")
    if isinstance(exc, TenantNotFound | KeyNotFound):
        return NotFound(str(exc), code="not_found")
    if isinstance(exc, TenantExists):
        return APIError(str(exc), code="conflict", status_code=409)
    if isinstance(exc, InvalidArgument):
        return InvalidRequest(str(exc), code="invalid_value")
    return APIError(str(exc), code="tenancy_error")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise InvalidRequest("the body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object", code="invalid_json")
    return data


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = data.get(name, default)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise InvalidRequest(f"{name!r} has the wrong type", param=name, code="invalid_type")
    return value


def _path(request: Request, name: str) -> str:
    return str(request.path_params[name])


async def _tenant_list(request: Request, ops: AdminOps) -> OpResult:
    return await ops.tenant_list()


async def _tenant_create(request: Request, ops: AdminOps) -> OpResult:
    data = await _body(request)
    name = _field(data, "name", str)
    if not name:
        raise InvalidRequest("'name' is required", param="name", code="missing_field")
    return await ops.tenant_create(name, _field(data, "tier", str, DEFAULT_TIER))


def _by_name(method: str) -> Handler:
    """A handler that calls `AdminOps.<method>(name)` with the {name} path parameter."""

    async def handler(request: Request, ops: AdminOps) -> OpResult:
        result: OpResult = await getattr(ops, method)(_path(request, "name"))
        return result

    return handler


async def _key_create(request: Request, ops: AdminOps) -> OpResult:
    label = _field(await _body(request), "label", str)
    return await ops.key_create(_path(request, "name"), label)


async def _key_revoke(request: Request, ops: AdminOps) -> OpResult:
    return await ops.key_revoke(_path(request, "key_id"))


async def _key_rotate(request: Request, ops: AdminOps) -> OpResult:
    grace = _field(await _body(request), "grace_s", (int, float), 3600.0)
    return await ops.key_rotate(_path(request, "key_id"), float(grace))


async def _quota_show(request: Request, ops: AdminOps) -> OpResult:
    return await ops.quota_show(_path(request, "name"), request.query_params.get("key"))


async def _quota_set(request: Request, ops: AdminOps) -> OpResult:
    data = await _body(request)
    limits = _field(data, "limits", dict, {})
    changes = {str(k): "unlimited" if v is None else str(v) for k, v in limits.items()}
    return await ops.quota_set(_path(request, "name"), _field(data, "key_id", str), changes)


async def _usage_show(request: Request, ops: AdminOps) -> OpResult:
    q = request.query_params
    by_key = q.get("by_key", "") in ("1", "true")
    return await ops.usage_show(q.get("tenant"), q.get("key"), q.get("since"), q.get("until"), by_key)


async def _audit_show(request: Request, ops: AdminOps) -> OpResult:
    limit = request.query_params.get("limit", "50")
    if not limit.isdigit():
        raise InvalidRequest("'limit' must be a positive integer", param="limit", code="invalid_value")
    return await ops.audit_show(int(limit))


# (method, path, handler, 201 on success, the response holds a key)
_TABLE: list[tuple[str, str, Handler, bool, bool]] = [
    ("GET", "/tenants", _tenant_list, False, False),
    ("POST", "/tenants", _tenant_create, True, False),
    ("GET", "/tenants/{name}", _by_name("tenant_show"), False, False),
    ("DELETE", "/tenants/{name}", _by_name("tenant_delete"), False, False),
    ("POST", "/tenants/{name}/suspend", _by_name("tenant_suspend"), False, False),
    ("POST", "/tenants/{name}/resume", _by_name("tenant_resume"), False, False),
    ("GET", "/tenants/{name}/keys", _by_name("key_list"), False, False),
    ("POST", "/tenants/{name}/keys", _key_create, True, True),
    ("GET", "/tenants/{name}/quota", _quota_show, False, False),
    ("PUT", "/tenants/{name}/quota", _quota_set, False, False),
    ("POST", "/keys/{key_id}/revoke", _key_revoke, False, False),
    ("POST", "/keys/{key_id}/rotate", _key_rotate, False, True),
    ("GET", "/usage", _usage_show, False, False),
    ("GET", "/audit", _audit_show, False, False),
]


def admin_refusal(request: Request, admin_token: str | None) -> Response | None:
    """The answer to a request without the admin token (404 while no token is configured, else 401), or
    None: it is the admin. Every admin route asks this first (gateway/lora_admin.py's too)."""
    if not admin_token:
        return NotFound("the admin API is disabled: set PAGESERVE_ADMIN_TOKEN", code="not_found").response()
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # compare_digest on bytes: the time taken does not depend on where the tokens differ
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"),
                                                              admin_token.encode("utf-8")):
        return AuthenticationError("invalid admin token", code="invalid_admin_token").response()
    return None


def admin_routes(admin_token: str | None, get_store: StoreGetter = _gateway_store) -> Mount:
    """The /admin mount. `admin_token=None` disables it (404 everywhere)."""

    def endpoint(handler: Handler, created: bool, secret: bool) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if (refusal := admin_refusal(request, admin_token)) is not None:
                return refusal
            store = get_store(request)
            ops = AdminOps(TenantStore(store.redis, store.prefix, actor=ACTOR))
            try:
                result = await handler(request, ops)
            except TenancyError as exc:
                return _api_error(exc).response()
            except APIError as exc:
                return exc.response()
            headers = {"Cache-Control": "no-store"} if secret else None
            return JSONResponse(result.data, status_code=201 if created else 200, headers=headers)

        return run

    routes = [Route(path, endpoint(handler, created, secret), methods=[method])
              for method, path, handler, created, secret in _TABLE]
    return Mount("/admin", routes=routes)
