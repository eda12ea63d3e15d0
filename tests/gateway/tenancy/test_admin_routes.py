"""/admin routes over HTTP against real Redis: every operation, the token guard, keys shown once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from gateway.admin_routes import admin_routes
from gateway.tenancy import TenantStore
from gateway.tenancy.admission import Admission

pytestmark = pytest.mark.anyio
TOKEN = "admin-secret-token-for-tests"


def app_for(store: TenantStore, token: str | None = TOKEN) -> Starlette:
    return Starlette(routes=[admin_routes(token, get_store=lambda request: store)])


@pytest.fixture
async def http(store: TenantStore) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_for(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


async def test_every_admin_operation_over_http(http: httpx.AsyncClient, store: TenantStore, admission: Admission):
    r = await http.post("/admin/tenants", json={"name": "acme", "tier": "free"})
    assert r.status_code == 201 and r.json()["tier"] == "free"
    assert (await http.post("/admin/tenants", json={"name": "acme"})).status_code == 409
    r = await http.post("/admin/tenants/acme/keys", json={"label": "ci"})
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    key, key_id = r.json()["key"], r.json()["id"]
    assert (await store.authenticate(key)).tenant == "acme"
    listing = (await http.get("/admin/tenants/acme/keys")).text + (await http.get("/admin/tenants/acme")).text
    assert key not in listing and key_id in listing

    r = await http.put("/admin/tenants/acme/quota", json={"limits": {"rpm": 7, "daily_tokens": "unlimited"}})
    assert r.status_code == 200 and r.json()["limits"]["rpm"] == 7 and r.json()["limits"]["daily_tokens"] is None
    r = await http.put("/admin/tenants/acme/quota", json={"key_id": key_id, "limits": {"concurrency": 2}})
    assert r.json()["limits"]["concurrency"] == 2
    assert (await http.get("/admin/tenants/acme/quota", params={"key": key_id})).json()["overrides"] == ["concurrency"]

    auth = await store.authenticate(key)
    await (await admission.admit(auth, 11, 20)).settle(11, 5)
    rows = (await http.get("/admin/usage", params={"tenant": "acme"})).json()["rows"]
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(1, 11, 5)]
    rows = (await http.get("/admin/usage", params={"key": key_id})).json()["rows"]
    assert rows[0]["key_id"] == key_id and rows[0]["tenant"] == "acme"
    rows = (await http.get("/admin/usage", params={"tenant": "acme", "by_key": "1"})).json()["rows"]
    assert [(r["key_id"], r["completion_tokens"]) for r in rows] == [(key_id, 5)]

    assert (await http.post("/admin/tenants/acme/suspend")).json()["status"] == "suspended"
    assert await store.authenticate(key) is None
    assert (await http.post("/admin/tenants/acme/resume")).json()["status"] == "active"
    r = await http.post(f"/admin/keys/{key_id}/rotate", json={"grace_s": 60})
    new_key = r.json()["key"]
    assert r.json()["replaces"] == key_id and await store.authenticate(key) and await store.authenticate(new_key)
    assert (await http.post(f"/admin/keys/{key_id}/revoke")).json()["status"] == "revoked"
    assert await store.authenticate(key) is None
    assert (await http.delete("/admin/tenants/acme")).status_code == 200
    assert await store.authenticate(new_key) is None

    audit = (await http.get("/admin/audit", params={"limit": 100})).json()
    assert {e["actor"] for e in audit} == {"admin-api"}
    assert [e["action"] for e in audit] == ["tenant.create", "key.create", "quota.set", "quota.set",
                                            "tenant.suspend", "tenant.resume", "key.create", "key.rotate",
                                            "key.revoke", "tenant.delete"]
    assert key not in str(audit) and new_key not in str(audit)


@pytest.mark.parametrize("auth_header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "])
async def test_a_missing_or_wrong_admin_token_is_401(store: TenantStore, auth_header):
    transport = httpx.ASGITransport(app=app_for(store))
    headers = {"Authorization": auth_header} if auth_header else {}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as c:
        r = await c.post("/admin/tenants", json={"name": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
    assert TOKEN not in r.text
    assert await store.list_tenants() == []


async def test_a_tenant_api_key_is_not_an_admin_token(store: TenantStore):
    await store.create_tenant("tenant-a")
    key, _ = await store.create_key("tenant-a")
    transport = httpx.ASGITransport(app=app_for(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                 headers={"Authorization": f"Bearer {key}"}) as c:
        for r in [await c.get("/admin/usage", params={"tenant": "tenant-a"}), await c.get("/admin/tenants"),
                  await c.post("/admin/tenants/tenant-a/keys", json={})]:
            assert r.status_code == 401 and key not in r.text


async def test_without_a_configured_token_the_admin_api_does_not_exist(store: TenantStore):
    transport = httpx.ASGITransport(app=app_for(store, token=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                 headers={"Authorization": "Bearer "}) as c:
        assert (await c.get("/admin/tenants")).status_code == 404


async def test_bad_admin_input_gets_openai_shaped_errors(http: httpx.AsyncClient):
    cases = [
        (http.post("/admin/tenants", content=b"{nope"), 400, "invalid_json"),
        (http.post("/admin/tenants", json={"tier": "free"}), 400, "missing_field"),
        (http.post("/admin/tenants", json={"name": 5}), 400, "invalid_type"),
        (http.post("/admin/tenants", json={"name": "a", "tier": "gold"}), 400, "invalid_value"),
        (http.get("/admin/tenants/ghost"), 404, "not_found"),
        (http.post("/admin/keys/key_ghost/revoke"), 404, "not_found"),
        (http.put("/admin/tenants/ghost/quota", json={"limits": {"rpm": 1}}), 404, "not_found"),
        (http.get("/admin/audit", params={"limit": "-3"}), 400, "invalid_value"),
    ]
    for call, status, code in cases:
        r = await call
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    await http.post("/admin/tenants", json={"name": "a"})
    r = await http.put("/admin/tenants/a/quota", json={"limits": {"rpm": -1}})
    assert r.status_code == 400 and "rpm" in r.json()["error"]["message"]
    r = await http.put("/admin/tenants/a/quota", json={"limits": {"bogus": 1}})
    assert r.status_code == 400 and "unknown limit" in r.json()["error"]["message"]
