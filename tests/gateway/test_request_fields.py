"""The field policy (gateway/request_fields.py) and the integer bounds of the request models."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.gateway.test_app import CHAT

COMPLETION = {"model": "smollm2", "prompt": "The capital of France is"}


def test_unknown_top_level_fields_are_ignored_with_a_warning_naming_them(
    make_gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gw = make_gateway()
    secret = "do-not-log-this-value"
    with caplog.at_level(logging.WARNING, logger="pageserve.gateway"):
        r = gw.post("/v1/chat/completions", {**CHAT, "my_extension": secret, "request_id": "abc",
                                             "vllm_xargs": {"k": secret}})
    assert r.status_code == 200, r.text
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any("my_extension" in w and "vllm_xargs" in w and "request_id" in w for w in warnings)
    assert all(secret not in rec.getMessage() for rec in caplog.records)


def test_logged_names_are_bounded(make_gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    gw = make_gateway()
    extras = {f"x{i}_" + "n" * 500: i for i in range(20)}
    with caplog.at_level(logging.WARNING, logger="pageserve.gateway"):
        assert gw.post("/v1/completions", {**COMPLETION, **extras}).status_code == 200
    line = next(rec.getMessage() for rec in caplog.records if "ignored request fields" in rec.getMessage())
    assert len(line) < 1000 and "(+12 more)" in line


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"stream_options": {"include_usage": True, "bogus": 1}}, "stream_options.bogus"),
        ({"messages": [{"role": "user", "content": "x", "bogus": 1}]}, "messages[0].bogus"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
         "messages[0].content"),
    ],
)
def test_nested_objects_stay_strict(make_gateway: Any, patch: dict[str, Any], param: str) -> None:
    gw = make_gateway()
    body = {**CHAT, **patch}
    if "stream_options" in patch:
        body["stream"] = True
    r = gw.post("/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("chat_template", "{{ x }}"),
     ("priority", -5), ("cache_salt", "s"), ("return_tokens_as_token_ids", True),
     ("add_special_tokens", True)],
)
def test_known_fields_we_cannot_honour_are_400_naming_them(make_gateway: Any, field: str, value: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, field: value})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == field and err["code"] == "unsupported_parameter"
    assert gw.engine.submitted == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("logprobs", False), ("use_beam_search", False), ("add_generation_prompt", True), ("tools", None),
     ("skip_special_tokens", True), ("add_special_tokens", False), ("response_format", {"type": "text"}),
     ("min_p", 0.0), ("frequency_penalty", 0)],
)
def test_their_neutral_values_are_accepted(make_gateway: Any, field: str, value: Any) -> None:
    gw = make_gateway()
    assert gw.post("/v1/chat/completions", {**CHAT, field: value}).status_code == 200


def test_add_special_tokens_neutral_value_depends_on_the_endpoint(make_gateway: Any) -> None:
    gw = make_gateway()
    assert gw.post("/v1/completions", {**COMPLETION, "add_special_tokens": True}).status_code == 200
    assert gw.post("/v1/completions", {**COMPLETION, "add_special_tokens": False}).status_code == 400


HUGE = [2**63, 2**64, 2**64 + 1, 10**30, -(2**64)]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("field", ["seed", "max_tokens", "max_completion_tokens", "top_k", "n", "min_tokens"])
def test_integers_beyond_the_wire_are_400_naming_them(make_gateway: Any, field: str, value: int) -> None:
    gw = make_gateway()
    if field == "seed" and value == 2**63 - 1:
        return
    r = gw.post("/v1/chat/completions", {**CHAT, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert gw.engine.submitted == []


@pytest.mark.parametrize("value", [2**31, 2**64, -1])
def test_token_ids_beyond_the_wire_are_400(make_gateway: Any, value: int) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "stop_token_ids": [1, value]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids[1]"
    r = gw.post("/v1/completions", {**COMPLETION, "prompt": [1, value]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt")
    assert gw.engine.submitted == []


def test_stop_token_ids_outside_the_vocabulary_are_400(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "stop_token_ids": [2, 10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"
    assert gw.engine.submitted == []


def test_extreme_seeds_inside_int64_reach_the_engine(make_gateway: Any) -> None:
    gw = make_gateway()
    for seed in (2**63 - 1, -(2**63)):
        assert gw.post("/v1/chat/completions", {**CHAT, "seed": seed, "n": 2}).status_code == 200
    assert [s.sampling.seed for s in gw.engine.submitted] == [2**63 - 1, -(2**63)]


def test_top_k_minus_one_disables_it_like_vllm(make_gateway: Any) -> None:
    gw = make_gateway()
    assert gw.post("/v1/chat/completions", {**CHAT, "top_k": -1}).status_code == 200
    assert gw.engine.submitted[0].sampling.top_k == 0


@pytest.mark.parametrize("value", [1e308 * 10, "nan"])
def test_non_finite_floats_are_400(make_gateway: Any, value: Any) -> None:
    gw = make_gateway()
    raw = ('{"model": "smollm2", "prompt": "x", "temperature": ' + ("1e999" if value != "nan" else "NaN") + "}")
    r = gw.client.post("/v1/completions", content=raw.encode(), headers={"Authorization": f"Bearer {gw.key}"})
    assert r.status_code == 400


@pytest.mark.parametrize(
    "body",
    [{"model": "smollm2", "prompt": ""}, {"model": "smollm2", "prompt": []}, {"model": "", "prompt": "x"},
     {"model": "smollm2"}, {"prompt": "x"}, {"model": "smollm2", "prompt": "x" * 300_000},
     {"model": "smollm2", "prompt": "x", "stop": "s" * 10_000}, {"model": ["smollm2"], "prompt": "x"}],
)
def test_empty_huge_and_missing_values_are_4xx(make_gateway: Any, body: dict[str, Any]) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", body)
    assert 400 <= r.status_code < 500 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert gw.engine.submitted == []
