"""pydantic's validation errors as OpenAI-shaped 400s: which field, never its value.

Owns the mapping from a pydantic `ValidationError` to an `InvalidRequest` whose `param` names the
offending field the way a client wrote it (`messages[0].content`), with pydantic's union-branch
tags dropped. Shared by the generation bodies (gateway/schemas.py) and /tokenize
(gateway/tokenize_api.py); knows nothing about which fields exist.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from gateway.errors import InvalidRequest


def invalid_request(e: ValidationError) -> InvalidRequest:
    """pydantic's first error as a 400 naming the field (never echoing the value)."""
    err = e.errors(include_input=False, include_url=False)[0]
    param = _param_name(err["loc"])
    if err["type"] == "extra_forbidden":
        return InvalidRequest(f"unsupported parameter: {param}", param=param, code="unsupported_parameter")
    if err["type"] == "missing":
        return InvalidRequest(f"missing required parameter: {param}", param=param, code="missing_parameter")
    return InvalidRequest(f"invalid value for {param}: {err['msg']}", param=param, code="invalid_value")


_UNION_TAG = re.compile(r"[\[\]-]|^(str|int|float|bool|list|dict)$")


def _param_name(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'content', 'str') -> 'messages[0].content'; union branch tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_TAG.search(part):
            out += f".{part}" if out else part
    return (out or "body")[:128]  # a nested key is the client's text: bounded
