"""Schemathesis over the generation routes against the real stack: gateway process, engine process with
the default model, redis-server (the session's e2e `stack`).

tests/gateway/test_openapi_fuzz.py fuzzes every route with many cases against a fast engine stand-in;
this runs few cases (positive and negative) through the real engine, where sampling, grammars and
detokenisation really happen. Every response: no 5xx, a 4xx in OpenAI's error shape, conforming to
the document. Afterwards the engine still serves a normal request and nothing is held: no KV block,
lease or reservation, no request in the engine or in the gateway's in-flight gauge.

Lengths are clamped (a valid `max_tokens` over 4 becomes 1..4, `n` over 2 becomes 1..2, and one left out is
1..4, never the context's end) so the run stays inside its budget on two cores; invalid values are
left as drawn. A longer, random run:

    PAGESERVE_ENGINE_FUZZ_EXAMPLES=200 PYTHONPATH=$PWD .venv/bin/python -m pytest \\
        tests/e2e/test_openapi_fuzz_engine.py
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.e2e.conftest import Stack
from tests.gateway.test_openapi_fuzz import CHECKS, FUZZ, SCHEMA, assert_openai_shaped
from tests.support.fault_stack import Books, engine_stats, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = int(os.environ.get("PAGESERVE_ENGINE_FUZZ_EXAMPLES", "10"))
# No shrinking: each case costs the engine's time, and a failing case is printed whole anyway.
ENGINE_FUZZ = settings(FUZZ, max_examples=EXAMPLES, derandomize="PAGESERVE_ENGINE_FUZZ_EXAMPLES" not in os.environ,
                       phases=[Phase.explicit, Phase.reuse, Phase.generate])
ROUTES = ["/v1/chat/completions", "/v1/completions"]
LENGTH_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "min_tokens": 4, "n": 2}
SETTLE_S = 30.0


def _clamp(body: dict[str, Any], data: st.DataObject) -> None:
    """Keep valid lengths short (the engine's time, not the gateway's checks, is what they cost)."""
    for field, cap in LENGTH_CAPS.items():
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[field] = data.draw(st.integers(1, cap))
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = data.draw(st.integers(1, LENGTH_CAPS["max_tokens"]))  # not the context's end


def _towards_the_engine(body: dict[str, Any], mode: GenerationMode, data: st.DataObject) -> None:
    """Most positive cases reach the engine: the served model, and (three times in four) a conversation the
    templates accept (the schema cannot say that a tool message needs its call's id); the other
    fields stay as drawn. The fast fuzz covers the refusals in depth."""
    if mode == GenerationMode.POSITIVE or data.draw(st.booleans()):
        body["model"] = "smollm2"
    if mode == GenerationMode.POSITIVE and "messages" in body and data.draw(st.integers(0, 3)):
        body["messages"] = [{"role": "user", "content": data.draw(st.text(min_size=1, max_size=40))}]
    _clamp(body, data)


@pytest.fixture(scope="module")
def books(stack: Stack, redis_url: str) -> Any:
    b = Books(redis_url, "e2e", "e2e-tenant", stack.engine_address)
    yield b
    b.close()


def _gateway_in_flight(stack: Stack) -> float:
    """The gateway's in-flight table (`pageserve:active_streams`, all workers), from /metrics.

    The gauge must be there: a missing one would read as "nothing held" and hide a leaked stream."""
    text = httpx.get(stack.base_url + "/metrics", timeout=10).text
    values = re.findall(r"^pageserve:active_streams(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert values, "pageserve:active_streams is missing from the gateway's /metrics"
    return sum(float(v) for v in values)


def _nothing_held(stack: Stack, books: Books) -> bool:
    """No KV block, lease, reservation, request in the engine (per tenant too) or stream in the gateway."""
    tenants_in_engine = sum(t.in_flight for t in engine_stats(stack.engine_address).by_tenant)
    return books.nothing_held() and tenants_in_engine == 0 and _gateway_in_flight(stack) == 0


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
@pytest.mark.parametrize("path", ROUTES)
def test_generation_routes_against_the_real_engine(stack: Stack, books: Books, path: str,
                                                   mode: GenerationMode) -> None:
    operation = SCHEMA[path]["POST"]
    statuses: list[int] = []

    @ENGINE_FUZZ
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        if isinstance(case.body, dict):
            _towards_the_engine(case.body, mode, data)
        kwargs = case.as_transport_kwargs(base_url=stack.base_url, headers=stack.headers())
        kwargs.pop("cookies", None)
        response = httpx.request(**kwargs, timeout=60)
        statuses.append(response.status_code)
        assert_openai_shaped(response)
        case.validate_response(response, checks=CHECKS)

    run()
    assert statuses, "no case reached the gateway"
    _still_serving(stack)
    wait_until(lambda: _nothing_held(stack, books), SETTLE_S, "no KV block, lease, reservation or in-flight request")


def _still_serving(stack: Stack) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3,
            "temperature": 0}
    r = httpx.post(stack.base_url + "/v1/chat/completions", json=body, headers=stack.headers(), timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length")
