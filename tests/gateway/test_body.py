"""gateway/body.py: every malformed body is an OpenAI-shaped 4xx, never a 500 or a hang."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.body import MAX_DEPTH, parse_json
from gateway.errors import InvalidRequest

CHAT = b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"{nope", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": Infinity}', "Infinity"),
        (b'{"a": -Infinity}', "-Infinity"),
        (b'{"a": 1e400}', "too large"),
        (b'{"a": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"a": "\xff\xfe"}', "UTF-8"),
        (b'{"a": "\xed\xa0\x80"}', "UTF-8"),  # a surrogate encoded as UTF-8 bytes
        (b'{"a": "\\ud800"}', "surrogate"),
        (b'{"a": ["ok", {"b": "x\\udfffy"}]}', "surrogate"),
        (b'{"\\ud800": 1}', "surrogate"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),  # the parser's RecursionError
        (b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "nested"),
    ],
)
def test_malformed_bodies_are_400(raw: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_json(raw)
    assert says in e.value.message and e.value.code == "invalid_json"


def test_surrogate_error_names_the_field() -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_json(b'{"messages": [{"role": "user", "content": "\\ud83d"}]}')
    assert e.value.param == "messages"


def test_valid_bodies_parse() -> None:
    assert parse_json(CHAT + b"}")["model"] == "smollm2"
    assert parse_json('{"a": "\\ud83d\\ude00 é"}'.encode())["a"] == "\U0001f600 é"  # a surrogate *pair* is text
    depth_ok = b'{"a": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    assert parse_json(depth_ok)
    assert parse_json(b'{"a": 1e300, "b": -0.0}')["a"] == 1e300


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_non_json_content_type_is_415(make_gateway: Any, content_type: str) -> None:
    gw = make_gateway()
    r = gw.client.post("/v1/chat/completions", content=CHAT + b"}",
                       headers={"Authorization": f"Bearer {gw.key}", "Content-Type": content_type})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert gw.engine.submitted == []


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "application/vnd.api+json"])
def test_json_or_no_content_type_is_accepted(make_gateway: Any, content_type: str | None) -> None:
    gw = make_gateway()
    headers = {"Authorization": f"Bearer {gw.key}"}
    if content_type:
        headers["Content-Type"] = content_type
    r = gw.client.post("/v1/chat/completions", content=CHAT + b"}", headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "raw",
    [b"", b'{"model": NaN}', b'{"model": "smollm2", "messages": [{"role": "user", "content": "\\udc00"}]}',
     b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"\xff"],
)
def test_malformed_bodies_through_the_app(make_gateway: Any, raw: bytes) -> None:
    gw = make_gateway()
    r = gw.client.post("/v1/completions", content=raw,
                       headers={"Authorization": f"Bearer {gw.key}", "Content-Type": "application/json"})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def _slow_body(declared: int, sent: bytes, timeout_s: float) -> Any:
    import anyio
    from starlette.requests import Request

    from gateway.body import read_json_object

    parts = [{"type": "http.request", "body": sent, "more_body": True}]

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await anyio.sleep_forever()  # the client declared more than it sends and keeps the socket open
        raise AssertionError

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", str(declared).encode()), (b"content-type", b"application/json")]}
    return await read_json_object(Request(scope, receive), 1 << 20, timeout_s)


def test_a_body_that_never_arrives_whole_is_408_not_a_hang() -> None:
    import anyio

    from gateway.errors import APIError

    with pytest.raises(APIError) as e:
        anyio.run(_slow_body, 100, b'{"model": ', 0.2)
    assert e.value.status_code == 408 and e.value.code == "request_timeout"
