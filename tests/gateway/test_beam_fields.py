"""Beam search and best_of in the request body: what reaches the engine, and vLLM's 400s for
combinations it refuses (shared/sampling.py holds the rules; the gateway names the field)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.fakes import Script
from tests.gateway.test_app import CHAT


def test_beam_search_fields_reach_the_engine(make_gateway: Any) -> None:
    gw = make_gateway()
    body = {**CHAT, "use_beam_search": True, "n": 2, "best_of": 4, "length_penalty": 0.5, "early_stopping": "never"}
    r = gw.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    sampling = gw.engine.submitted[0].sampling
    assert (sampling.use_beam_search, sampling.n, sampling.beam_width) == (True, 2, 4)
    assert (sampling.length_penalty, sampling.early_stopping) == (0.5, "never")
    assert sampling.temperature == 0.0  # beam search is greedy: an absent temperature means 0


def test_best_of_reaches_the_engine_and_reserves_every_candidate(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, "n": 1, "best_of": 3, "temperature": 0.8, "max_tokens": 5})
    assert r.status_code == 200, r.text
    sampling = gw.engine.submitted[0].sampling
    assert (sampling.n, sampling.best_of, sampling.use_beam_search) == (1, 3, False)


def test_best_of_usage_counts_the_candidates_not_returned(make_gateway: Any) -> None:
    gw = make_gateway(lambda request: Script(samples=[[7042, 314, 17915, 30]], unreturned=7))
    r = gw.post("/v1/chat/completions", {**CHAT, "best_of": 3, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4 + 7
    assert len(r.json()["choices"]) == 1


@pytest.mark.parametrize(
    ("patch", "param"),
    [({"use_beam_search": True, "temperature": 0.7}, "temperature"),
     ({"use_beam_search": True, "top_p": 0.5}, "top_p"),
     ({"use_beam_search": True, "logprobs": True, "top_logprobs": 2}, "logprobs"),
     ({"use_beam_search": True, "n": 4, "best_of": 2}, "best_of"),
     ({"best_of": 0}, "best_of"),
     ({"best_of": True}, "best_of"),
     ({"length_penalty": 0.5}, "length_penalty"),
     ({"early_stopping": True}, "early_stopping"),
     ({"use_beam_search": True, "early_stopping": "sometimes"}, "early_stopping"),
     # h9's options the beams would silently drop (they rank the raw logits; a deferred group has no prompt delta)
     ({"use_beam_search": True, "allowed_token_ids": [1, 2]}, "allowed_token_ids"),
     ({"use_beam_search": True, "prompt_logprobs": 1}, "prompt_logprobs"),
     ({"best_of": 2, "prompt_logprobs": 0}, "prompt_logprobs")],
)
def test_combinations_vllm_refuses_are_400_naming_the_field(make_gateway: Any, patch: dict[str, Any],
                                                             param: str) -> None:
    gw = make_gateway()
    r = gw.post("/v1/chat/completions", {**CHAT, **patch})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert gw.engine.submitted == []
