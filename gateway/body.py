"""A request body from the socket to a plain JSON object, or a 4xx: never a 500, never a hang.

Owns everything between the bytes and a `dict`: the content type, the size limit
(checked against Content-Length first and again while a chunked body streams in,
so nothing over the limit is buffered whole), a deadline for the whole body (a
client that declares more than it sends, or trickles it, gets a 408 instead of
holding the request open forever), and a strict JSON parse: only
UTF-8, no NaN/Infinity literals, no number that overflows to infinity, no lone
UTF-16 surrogate (`"\\ud800"` decodes to a str that cannot be encoded back to
UTF-8 and would fail later, in the tokenizer or the response), and at most
`MAX_DEPTH` levels of nesting (deeper than the stdlib parser's recursion limit
is its RecursionError, caught here: a 400, not a 500).

The caller reads a body only after the key was verified (`gateway/auth.py`).
It knows nothing about the OpenAI fields inside the object.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import anyio
from starlette.requests import Request

from gateway.errors import APIError, InvalidRequest

MAX_DEPTH = 64
"""Nesting levels allowed in a body (a chat request needs 4; a JSON schema in response_format a few dozen)."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")


async def read_json_object(request: Request, limit: int, timeout_s: float) -> dict[str, Any]:
    """The body as a JSON object: 415 for a non-JSON content type, 413 past `limit`, 408 after
    `timeout_s`, 400 otherwise."""
    check_content_type(request)
    with anyio.move_on_after(timeout_s) as deadline:
        raw = await read_body(request, limit)
    if deadline.cancelled_caught:
        raise APIError(f"the request body did not arrive within {timeout_s:g} s", code="request_timeout",
                       status_code=408)
    return parse_json(raw)


def check_content_type(request: Request) -> None:
    """JSON or no declared type (clients that send none mean JSON); anything else is a 415."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    raise APIError(f"unsupported content type {media[:64]!r}: send the body as application/json",
                   code="unsupported_media_type", status_code=415)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it passes `limit` bytes (never buffered whole first)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise InvalidRequest("the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_json") from None
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotFinite as e:
        raise InvalidRequest(str(e), code="invalid_json") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, ints over 4,300 digits
        raise InvalidRequest(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    _check_strings(body)
    return body


def _too_large(limit: int) -> APIError:
    return APIError(f"request body exceeds {limit} bytes", code="request_too_large", status_code=413)


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(f"{name} is not valid JSON: numbers must be finite")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotFinite(f"the number {literal[:32]} is too large: numbers must be finite")
    return value


def _check_strings(body: dict[str, Any]) -> None:
    """Every key and string value encodable as UTF-8 (no lone surrogate); at most MAX_DEPTH levels deep.

    Iterative, so a deep body costs no recursion here; the stdlib parser's own
    recursion limit (a RecursionError, caught above) bounds what reaches this.
    """
    stack: list[tuple[str, Any, int]] = []
    for key, value in body.items():
        _check_text(key, key)
        stack.append((key, value, 2))
    while stack:
        param, value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, param)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep",
                                 param=param, code="invalid_json")
        if isinstance(value, dict):
            for k, v in value.items():
                _check_text(k, param)
                stack.append((param, v, depth + 1))
        else:
            stack.extend((param, v, depth + 1) for v in value)


def _check_text(text: str, param: str) -> None:
    if _SURROGATE.search(text):
        raise InvalidRequest("a string contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
                             param=param[:64] if _SURROGATE.search(param) is None else None,
                             code="invalid_json")
