"""Fuzz every route of /openapi.json with schemathesis, plus strategies for what a schema cannot say.

Through the real app (real tokenizer, real tenancy on the session's redis-server)
with the fast engine stand-in. Every response must be: never a 5xx, a 4xx in
OpenAI's error shape, and a body that conforms to the document's response
schemas. The suite runs a small, derandomized budget (seconds); a longer,
random run:

    PAGESERVE_FUZZ_EXAMPLES=2000 PYTHONPATH=$PWD .venv/bin/python -m pytest tests/gateway/test_openapi_fuzz.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.openapi import openapi_document

EXAMPLES = int(os.environ.get("PAGESERVE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="PAGESERVE_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck))
SCHEMA = schemathesis.openapi.from_dict(openapi_document())
OPERATIONS = [(path, method.upper()) for path, item in openapi_document()["paths"].items() for method in item]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def assert_openai_shaped(response: Any) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text


def test_openapi_json_is_served_from_the_models(make_gateway: Any) -> None:
    gw = make_gateway()
    doc = gw.client.get("/openapi.json").json()
    assert doc == json.loads(json.dumps(openapi_document()))
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["properties"]["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
    assert "continuous_usage_stats" in doc["components"]["schemas"]["StreamOptions"]["properties"]
    assert {p for p in doc["paths"]} == {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                         "/v1/models/{model}", "/tokenize", "/detokenize"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_every_route_against_its_schema(make_gateway: Any, path: str, method: str, mode: GenerationMode) -> None:
    gw = make_gateway()
    operation = SCHEMA[path][method]

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        if isinstance(case.body, dict) and data.draw(st.booleans()):
            case.body["model"] = "smollm2"  # past the model check, into templating and generation
        if case.path_parameters and data.draw(st.booleans()):
            case.path_parameters["model"] = "smollm2"
        headers = {"Authorization": f"Bearer {gw.key}"} if data.draw(st.integers(0, 9)) else {}
        kwargs = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
        kwargs.pop("cookies", None)
        response = gw.client.request(**kwargs)
        assert_openai_shaped(response)
        case.validate_response(response, checks=CHECKS)

    run()


# ---------------------------------------------------------------- what the schema cannot express

CHAT_PREFIX = b'{"model": "smollm2", "messages": [{"role": "user", "content": "'
CHAT_SUFFIX = b'"}], "max_tokens": 4}'
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed",
          "stream", "stream_options", "min_tokens", "ignore_eos", "stop_token_ids", "tokens", "logprobs"]


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bad_utf8", "surrogate", "nesting", "numbers", "types"]))
    if kind == "bad_utf8":
        junk = draw(st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)))
        return CHAT_PREFIX + junk + CHAT_SUFFIX
    if kind == "surrogate":
        code = draw(st.integers(0xD800, 0xDFFF))
        return CHAT_PREFIX + f"a\\u{code:04x}b".encode() + CHAT_SUFFIX
    if kind == "nesting":
        depth = draw(st.integers(1, 3000))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        return b'{"model": "smollm2", "messages": ' + opener * depth + b"1" + closer * depth + b"}"
    if kind == "numbers":
        field = draw(st.sampled_from(FIELDS))
        literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", str(2**64), str(-(2**64)),
                                        str(2**63), "1" + "0" * 4400, "0.0000001", "-0"]))
        return (b'{"model": "smollm2", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "'
                + field.encode() + b'": ' + literal.encode() + b"}")
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    body.update(draw(st.dictionaries(st.sampled_from(FIELDS), json_values, min_size=1, max_size=3)))
    return json.dumps(body).encode()


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"])
def test_hostile_bodies_get_openai_shaped_4xx(make_gateway: Any, path: str) -> None:
    gw = make_gateway()

    @settings(FUZZ, max_examples=EXAMPLES * 2)
    @given(raw=hostile_bodies())
    def run(raw: bytes) -> None:
        r = gw.client.post(path, content=raw,
                           headers={"Authorization": f"Bearer {gw.key}", "Content-Type": "application/json"})
        assert_openai_shaped(r)

    run()
