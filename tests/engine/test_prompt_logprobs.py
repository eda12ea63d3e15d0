"""Prompt logprobs from the prompt's own step equal transformers' (float32, 1e-4), chunked or not,
beside requests that do not ask, and with a prompt whose prefix is in the prefix cache (such a
request skips the cache: engine/worker/prompt_logprobs.py states the rule)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.llm import LLM
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, random_prompts, tiny_model

__all__ = ["tiny_model"]

K = 3


@pytest.fixture(scope="module")
def hf(tiny_model: Path) -> object:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def reference(hf: object, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt position 1..L-1: the token's logprob (L-1,) and the K best ids (L-1, K)."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0].float()  # type: ignore[operator]
    lp = torch.log_softmax(logits, dim=-1)[:-1]  # (L-1, V) row p predicts token p + 1
    return lp.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1), lp.topk(K, dim=-1)


def check(result_lps: list, hf: object, prompt: list[int]) -> None:
    own, (top_values, top_ids) = reference(hf, prompt)
    assert len(result_lps) == len(prompt) - 1
    got = torch.tensor([lp.logprob for lp in result_lps])
    torch.testing.assert_close(got, own, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor([lp.top_logprobs for lp in result_lps]), top_values, atol=1e-4, rtol=0)
    assert [lp.top_token_ids for lp in result_lps] == top_ids.tolist()


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return make_llm(tiny_model, budget=8, block_size=4)  # an 8-token budget: a 30-token prompt takes 4 chunks


def test_prompt_logprobs_equal_transformers_over_several_chunks(llm: LLM, hf: object) -> None:
    long, short = random_prompts([30, 5], 512, seed=7)
    asks = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=K)
    results = llm.generate([long, short, short[:1]], [asks, SamplingParams(max_tokens=3, temperature=0), asks],
                           detokenize=False)
    check(results[0].prompt_logprobs, hf, long)
    assert results[1].prompt_logprobs == [] and results[2].prompt_logprobs == []  # did not ask; nothing to predict
    assert len(results[1].token_ids) == 3


def test_a_cached_prefix_is_not_read_by_a_request_asking_prompt_logprobs(llm: LLM, hf: object) -> None:
    (prompt,) = random_prompts([26], 512, seed=11)
    first = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0), detokenize=False)[0]
    asks = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=K), detokenize=False)[0]
    again = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0), detokenize=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0  # the prefix is cached
    assert asks.num_cached_tokens == 0  # ... but not read by the request that needs its rows
    check(asks.prompt_logprobs, hf, prompt)
    assert asks.token_ids == first.token_ids


@pytest.mark.slow
def test_tensor_parallel_ranks_agree_on_the_prompt_rows(tiny_model: Path, hf: object) -> None:
    """The prompt rows join the sampled rows' lm_head call, a collective under tensor parallelism: a
    step with prompt rows only (a middle chunk) must run it on every rank, or the ranks hang."""
    from engine.scheduling.config import SchedulerConfig

    llm = LLM(str(tiny_model), "float32", num_device_blocks=64, num_cpu_blocks=16, block_size=4,
              scheduler=SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4), tensor_parallel_size=2)
    try:
        (prompt,) = random_prompts([21], 512, seed=3)
        result = llm.generate(prompt, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=K),
                              detokenize=False)[0]
        check(result.prompt_logprobs, hf, prompt)
    finally:
        llm.close()
