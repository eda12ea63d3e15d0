"""gateway/sampling_plan.py: max_tokens decided once, with the reservation; no placeholder SamplingParams."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.sampling_plan import DecidedSampling, OutputLimits, decide_sampling
from gateway.schemas import parse_chat, parse_completion
from shared.model_info import ModelInfo, SamplingDefault
from shared.sampling import SamplingParams

INFO = ModelInfo("smollm2", max_model_len=256, block_size=16, eos_token_id=2, num_blocks=64, vocab_size=49152)
LIMITS = OutputLimits(completion_default_max_tokens=16, reservation_cap=100)
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "smollm2", "prompt": "hi"}


def chat(body: dict[str, Any], prompt_len: int = 56, info: ModelInfo = INFO,
         limits: OutputLimits = LIMITS) -> DecidedSampling:
    return decide_sampling("chat", parse_chat({**CHAT, **body}).settings, prompt_len, "messages", info, limits)


def test_a_chat_without_max_tokens_gets_the_room_left_and_reserves_at_most_the_cap() -> None:
    decided = chat({"n": 2})
    assert decided.sampling.max_tokens == 256 - 56
    assert decided.reserved_output_tokens == 2 * 100  # the cap, per sample: the room may be the whole context


def test_the_room_is_also_bounded_by_the_kv_pool() -> None:
    small_pool = ModelInfo("smollm2", max_model_len=256, block_size=16, eos_token_id=2, num_blocks=4)
    assert chat({}, info=small_pool).sampling.max_tokens == 64 - 56


def test_a_given_max_tokens_is_kept_and_reserved_in_full() -> None:
    decided = chat({"max_completion_tokens": 150, "n": 3})
    assert (decided.sampling.max_tokens, decided.reserved_output_tokens) == (150, 450)
    no_quotas = OutputLimits(completion_default_max_tokens=16, reservation_cap=None)
    assert chat({}, limits=no_quotas).reserved_output_tokens == 200


def test_completions_default_to_the_configured_max_tokens_and_min_tokens_raises_it() -> None:
    def completion(body: dict[str, Any]) -> SamplingParams:
        settings = parse_completion({**COMPLETION, **body}).settings
        return decide_sampling("completion", settings, 10, "prompt", INFO, LIMITS).sampling

    assert completion({}).max_tokens == 16
    assert completion({"min_tokens": 40}).max_tokens == 40


def test_the_engines_defaults_fill_the_fields_left_out() -> None:
    info = ModelInfo("smollm2", 256, 16, 2, 64, 49152, (SamplingDefault("temperature", 0.2),))
    assert chat({}, info=info).sampling.temperature == 0.2
    assert chat({"temperature": 1.5}, info=info).sampling.temperature == 1.5


@pytest.mark.parametrize(
    ("body", "param"),
    [({"temperature": 5}, "temperature"), ({"max_tokens": 10, "min_tokens": 11}, "min_tokens"),
     ({"max_completion_tokens": 300}, "max_completion_tokens"), ({"logit_bias": {"60000": 1}}, "logit_bias")],
)
def test_bad_values_are_a_400_naming_the_body_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        chat(body)
    assert e.value.param == param


def test_no_sampling_params_ever_exists_with_a_placeholder_max_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SamplingParams built between the body and the engine has the final max_tokens: parsing
    builds none, deciding builds them from the final value (a placeholder would show up here)."""
    built: list[int] = []
    check = SamplingParams.__post_init__

    def recording(self: SamplingParams) -> None:
        built.append(self.max_tokens)
        check(self)

    monkeypatch.setattr(SamplingParams, "__post_init__", recording)
    settings = parse_chat({**CHAT, "min_tokens": 3}).settings
    assert built == []
    info = ModelInfo("smollm2", 256, 16, 2, 64, 49152, (SamplingDefault("top_p", 0.9),))
    decided = decide_sampling("chat", settings, 56, "messages", info, LIMITS)
    assert built and set(built) == {decided.sampling.max_tokens} == {200}


def test_a_whole_number_float_is_that_integer_and_other_non_integers_are_refused() -> None:
    """JSON Schema (and so the OpenAPI document and its fuzzers) counts 5.0 as an integer."""
    decided = chat({"max_tokens": 5.0, "top_k": 3.0, "n": 2.0, "seed": 7.0})
    assert (decided.sampling.max_tokens, decided.sampling.top_k, decided.sampling.n, decided.sampling.seed) \
        == (5, 3, 2, 7)
    assert type(decided.sampling.max_tokens) is int
    for bad in ({"max_tokens": 5.5}, {"max_tokens": "5"}, {"max_tokens": True}, {"seed": 1e30}):
        with pytest.raises(InvalidRequest) as e:
            chat(bad)
        assert e.value.param == next(iter(bad))
