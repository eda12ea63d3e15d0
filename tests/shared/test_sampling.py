"""shared/sampling.py: what the wire and the sampler can hold is refused where the params are built."""

from __future__ import annotations

import pytest

from shared.sampling import MAX_STOP_TOKEN_IDS, SamplingError, SamplingParams


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 2**64}, "top_k"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"stop_token_ids": (2**64,)}, "stop_token_ids"),
        ({"stop_token_ids": tuple(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
    ],
)
def test_values_beyond_the_wire_or_the_sampler_are_refused(fields: dict[str, object], param: str) -> None:
    with pytest.raises(SamplingError) as caught:
        SamplingParams(**fields)  # type: ignore[arg-type]
    assert caught.value.param == param


def test_the_int64_edges_are_accepted() -> None:
    SamplingParams(seed=2**63 - 1, top_k=2**63 - 1, max_tokens=2**63 - 1, stop_token_ids=(0, 2**40))
    SamplingParams(seed=-(2**63))
    SamplingParams(seed=2**64 - 1)  # the unsigned range too: msgpack and torch's manual_seed hold it


def test_a_vanishing_temperature_samples_greedily() -> None:
    # logits / 1e-300 overflow to inf and the softmax to NaN: such a temperature means greedy.
    assert SamplingParams(temperature=1e-300).greedy
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams(temperature=0.01).greedy


def test_beam_search_and_best_of_travel_only_when_set() -> None:
    assert not {"best_of", "use_beam_search", "length_penalty", "early_stopping"} & set(SamplingParams().to_dict())
    beam = SamplingParams(n=2, best_of=4, use_beam_search=True, temperature=0, length_penalty=0.5,
                          early_stopping="never")
    assert SamplingParams.from_dict(beam.to_dict()) == beam
    assert (beam.beam_width, beam.num_candidates) == (4, 4)
    assert (SamplingParams(n=2, best_of=3).beam_width, SamplingParams(n=2, best_of=3).num_candidates) == (0, 3)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"use_beam_search": True, "temperature": 0.5}, "temperature"),
     ({"use_beam_search": True, "temperature": 0, "top_k": 5}, "top_k"),
     ({"use_beam_search": True, "temperature": 0, "min_tokens": 2}, "min_tokens"),
     ({"use_beam_search": True, "temperature": 0, "logit_bias": ((1, 1.0),)}, "logit_bias"),
     ({"n": 3, "best_of": 2}, "best_of"), ({"best_of": 17}, "best_of"),
     ({"length_penalty": 2.0}, "length_penalty"), ({"early_stopping": True}, "early_stopping"),
     ({"use_beam_search": True, "temperature": 0, "early_stopping": "soon"}, "early_stopping")],
)
def test_beam_search_and_best_of_refuse_what_vllm_refuses(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(SamplingError) as e:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert e.value.param == param


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"use_beam_search": True, "temperature": 0, "allowed_token_ids": (3, 4)}, "allowed_token_ids"),
     ({"use_beam_search": True, "temperature": 0, "bad_words_token_ids": ((5,),)}, "bad_words"),
     ({"use_beam_search": True, "temperature": 0, "prompt_logprobs": 1}, "prompt_logprobs"),
     ({"n": 1, "best_of": 2, "prompt_logprobs": 0}, "prompt_logprobs")],
)
def test_beam_search_and_best_of_refuse_what_they_would_silently_drop(kwargs: dict[str, object], param: str) -> None:
    """Beams rank the raw logits before the sampler's token filters, and a best_of > n or beam group
    sends no delta at its prompt step (where prompt logprobs ride): each would be ignored, so it is a 400."""
    with pytest.raises(SamplingError) as e:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert e.value.param == param


def test_prompt_logprobs_with_n_samples_that_all_stream_is_allowed() -> None:
    assert SamplingParams(n=2, best_of=2, prompt_logprobs=1).prompt_logprobs == 1
