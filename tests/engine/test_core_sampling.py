"""The sampling features through the real engine (tiny random Llama): logprobs, penalties, bias, seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.request import Request
from engine.scheduling.request_checks import RequestRejected
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, random_prompts, tiny_model

__all__ = ["tiny_model"]

FEATURES = {"presence_penalty": 0.8, "frequency_penalty": 0.4, "repetition_penalty": 1.3, "min_p": 0.02,
            "logit_bias": ((17, 3.0), (40, -5.0)), "logprobs": 4}


def test_greedy_logprobs_are_the_best_of_the_raw_distribution(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    prompt = random_prompts([11], 512)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3),
                       detokenize=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 6
    for token, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.top_token_ids[0] == token and lp.logprob == lp.top_logprobs[0]
        assert len(lp.top_token_ids) == 3 and lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)
    total = torch.tensor([lp.logprob for lp in out.logprobs])
    assert bool((total <= 0).all())
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                         detokenize=False)[0].outputs[0]
    assert plain.token_ids == out.token_ids and plain.logprobs == []  # asking changes nothing but the output


def test_seeded_sampling_with_every_feature_is_independent_of_the_batch_and_preemption(tiny_model: Path) -> None:
    prompt = random_prompts([15], 512, seed=4)[0]
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=9, max_tokens=24, ignore_eos=True, **FEATURES)
    alone = make_llm(tiny_model).generate([prompt], seeded, detokenize=False)[0].outputs[0]
    others = random_prompts([40, 3, 22], 512, seed=5)
    neighbours = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, frequency_penalty=1.0),
                  SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True, logprobs=20),
                  SamplingParams(temperature=0.9, max_tokens=30, ignore_eos=True, logit_bias=((5, 4.0),))]
    # Few blocks and a small budget: chunked prefill and preemption by recompute while it runs.
    crowded_llm = make_llm(tiny_model, blocks=18, budget=16, preemption_mode="recompute")
    crowd = crowded_llm.generate([*others, prompt], [*neighbours, seeded], detokenize=False)[3].outputs[0]
    assert crowd.token_ids == alone.token_ids
    # Logprobs agree to float noise: a batch's shape changes the order of the model's sums, not the tokens.
    assert [lp.top_token_ids for lp in crowd.logprobs] == [lp.top_token_ids for lp in alone.logprobs]
    assert [lp.logprob for lp in crowd.logprobs] == pytest.approx([lp.logprob for lp in alone.logprobs], abs=1e-4)
    assert crowded_llm.core.stats().preemptions > 0


def test_frequency_penalty_changes_a_greedy_run(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    prompt = random_prompts([9], 512, seed=2)[0]
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
                         detokenize=False)[0].token_ids
    penalised = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                                                      frequency_penalty=2.0, presence_penalty=2.0),
                             detokenize=False)[0].token_ids
    assert len(set(penalised)) > len(set(plain))


def test_logit_bias_forces_a_token_through_the_engine(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    out = llm.generate(random_prompts([7], 512), SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True,
                                                                logit_bias=((77, 100.0),)), detokenize=False)
    assert out[0].token_ids == [77] * 5


def test_a_bias_past_the_vocabulary_is_refused_by_the_core(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    with pytest.raises(RequestRejected, match="logit_bias names token id 512"):
        llm.core.add_request(Request("b", [5, 6], SamplingParams(logit_bias=((512, 1.0),)), arrival_time=0.0))
