"""Unauthenticated clients cannot make the gateway do expensive work (issue 11, section 5).

No body read, JSON parse, templating or tokenization happens before the key is
verified, whatever the body's size and whether or not it declares a length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request

import gateway.body
from gateway.prompts import Prompts
from gateway.recent_keys import RecentKeys
from gateway.tenancy.store import AuthContext
from tests.gateway.test_app import CHAT


@pytest.fixture
def work_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every body read, JSON parse, template render and tokenization the gateway does."""
    calls: list[str] = []

    def spy(name: str, owner: Any, attr: str) -> None:
        original = getattr(owner, attr)

        def wrapper(*a: Any, **kw: Any) -> Any:
            calls.append(name)
            return original(*a, **kw)

        monkeypatch.setattr(owner, attr, wrapper)

    spy("stream", Request, "stream")
    spy("body", Request, "body")
    spy("parse", gateway.body, "parse_json")
    for attr in ("_chat", "_encode", "_decode"):
        spy(attr, Prompts, attr)
    return calls


def _huge(n_chunks: int) -> Iterator[bytes]:
    yield b'{"model": "smollm2", "messages": [{"role": "user", "content": "'
    for _ in range(n_chunks):
        yield b"word " * 13_000
    yield b'"}]}'


ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("size", ["small", "large", "chunked"])
def test_bad_key_gets_401_before_any_work_on_the_body(make_gateway: Any, work_spy: list[str], path: str,
                                                      size: str) -> None:
    gw = make_gateway()
    headers = {"Authorization": "Bearer ps-not-a-real-key-000000000000000", "Content-Type": "application/json"}
    if size == "small":
        r = gw.client.post(path, json=CHAT, headers=headers)
    elif size == "large":
        r = gw.client.post(path, content=b"".join(_huge(30)), headers=headers)  # ~2 MB, under the limit
    else:
        r = gw.client.post(path, content=_huge(30), headers=headers)  # no Content-Length
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert work_spy == []
    assert gw.engine.submitted == []


@pytest.mark.parametrize("path", ROUTES)
def test_revoked_and_missing_keys_cost_no_work_either(make_gateway: Any, work_spy: list[str], path: str) -> None:
    gw = make_gateway()
    assert gw.post(path, CHAT, key=gw.revoked_key).status_code == 401
    assert gw.client.post(path, json=CHAT).status_code == 401
    assert work_spy == []


def test_a_good_key_does_the_work(make_gateway: Any, work_spy: list[str]) -> None:
    """The spy sees the work when the key is good: the test above would notice a key checked too late."""
    gw = make_gateway()
    assert gw.post("/v1/chat/completions", CHAT).status_code == 200
    assert {"stream", "parse", "_chat"} <= set(work_spy)


def test_a_bad_key_is_told_401_before_a_malformed_body_is_noticed(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.client.post("/v1/completions", content=b"{nope", headers={"Authorization": "Bearer ps-wrong"})
    assert r.status_code == 401


def test_recent_keys_expire_and_stay_bounded() -> None:
    now = [0.0]
    recent = RecentKeys(ttl_s=5.0, capacity=2, clock=lambda: now[0])
    auth = AuthContext("t_1", "acme", "key_1", "standard", 1, 1.0, "salt")
    recent.add("k1", auth)
    assert recent.get("k1") == auth and not recent.seen("k2")
    now[0] = 5.0
    assert not recent.seen("k1")
    for k in ("ps-key-a", "ps-key-b", "ps-key-c"):
        recent.add(k, auth)
    assert not recent.seen("ps-key-a") and recent.seen("ps-key-b") and recent.seen("ps-key-c")
    assert "ps-key" not in repr(recent._expiry)  # hashes only, never the key itself


def test_a_recently_verified_key_skips_the_early_round_trip(make_gateway: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.tenancy.store import TenantStore

    calls: list[str] = []
    original = TenantStore.authenticate

    async def counting(self: TenantStore, plaintext: str) -> Any:
        calls.append("authenticate")
        return await original(self, plaintext)

    monkeypatch.setattr(TenantStore, "authenticate", counting)
    gw = make_gateway()  # no quotas here: admission verifies with one authenticate per request
    for _ in range(3):
        assert gw.post("/v1/chat/completions", CHAT).status_code == 200
    assert len(calls) == 3 + 1  # one per admission, plus the first early check only
