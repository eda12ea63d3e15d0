"""The gateway refuses what would break the engine: ids outside the engine's vocabulary, numbers
beyond the wire. A 400 naming `param`, and nothing reaches the engine."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.engine_client import RequestFailedError
from shared.protocol import REQUEST_FAILED, REQUEST_REJECTED
from tests.gateway.fakes import Script

BASE = {"model": "smollm2", "prompt": "hello", "max_tokens": 2}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": [1, 49152]}, "prompt"),
        ({"stop_token_ids": [49152], "min_tokens": 1}, "stop_token_ids"),
        ({"stop_token_ids": [-5]}, "stop_token_ids"),
        ({"stop_token_ids": [2**64]}, "stop_token_ids"),
        ({"seed": 2**64, "temperature": 1}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 2**64}, "top_k"),
    ],
)
def test_ids_and_numbers_the_engine_cannot_hold_are_400(make_gateway: Any, fields: dict[str, Any],
                                                         param: str) -> None:
    gw = make_gateway()
    r = gw.post("/v1/completions", {**BASE, **fields})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"].split("[")[0] == param, r.text
    assert gw.engine.submitted == []


def test_the_vocabulary_is_the_engines(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.model_info = dataclasses.replace(gw.engine.model_info, vocab_size=1000)  # smaller than the tokenizer's
    r = gw.post("/v1/completions", {**BASE, "prompt": [1, 1000]})
    assert r.status_code == 400 and "size 1000" in r.json()["error"]["message"]
    r = gw.post("/v1/completions", {**BASE, "prompt": [1, 999]})
    assert r.status_code == 200


def test_an_engine_refusal_names_its_param(make_gateway: Any) -> None:
    refusal = RequestFailedError("token id 7 in stop_token_ids is outside", REQUEST_REJECTED, "stop_token_ids")
    gw = make_gateway(lambda req: Script([[]], fail=refusal))
    r = gw.post("/v1/completions", BASE)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("stop_token_ids")


def test_a_request_failed_mid_run_is_500_not_the_callers_fault(make_gateway: Any) -> None:
    gw = make_gateway(lambda req: Script([[]], fail=RequestFailedError("sampling failed", REQUEST_FAILED)))
    r = gw.post("/v1/completions", BASE)
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_request_error"
