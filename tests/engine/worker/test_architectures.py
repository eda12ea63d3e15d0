"""Every supported architecture, float32 greedy tokens equal to transformers' own `generate`.

Each tiny model (tests/support/tiny_model.py) sets its architecture's knobs to values the
prompts reach (windows shorter than the prompts, soft-caps that bite, head_dim unlike
hidden/heads, partial rotary, LongRoPE's attention factor). One engine per architecture runs:
a batch of mixed lengths under a block budget that forces swap preemption and chunked prefill,
then prompts sharing a prefix with the first batch (prefix-cache hits), and one request with
n=2. bfloat16 is checked against the float32 model's log probabilities with a stated tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.worker.models.architectures import read_architecture
from engine.worker.models.spec import ModelConfigError
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import hf_greedy, make_llm, random_prompts
from tests.support.tiny_model import ARCHITECTURES, tiny_folder, tiny_gemma3_multimodal_folder

LENGTHS = [1, 5, 17, 33, 8, 45, 2, 25]
NEW_TOKENS = 24
# min_tokens: hf_greedy's min_new_tokens masks EOS, ignore_eos alone does not (as in vLLM)
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(request.param, tmp_path_factory.mktemp(request.param))


def _hf(folder: Path) -> torch.nn.Module:
    # eager attention: the one transformers path with every option (soft-caps, windows) applied
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def test_float32_greedy_equals_transformers(folder: Path) -> None:
    hf = _hf(folder)
    prompts = random_prompts(LENGTHS, 512)
    llm = make_llm(folder, blocks=36, block_size=4, budget=24, max_model_len=128)
    results = llm.generate(prompts, GREEDY, detokenize=False)
    stats = llm.core.stats()
    assert stats.preemptions > 0 and stats.blocks_swapped_in > 0, "the budget must force a swap"
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == hf_greedy(hf, prompt, NEW_TOKENS), f"prompt of {len(prompt)} tokens diverged"
    # prefix-cache hits: prompts continuing the first batch's longest ones
    again = [prompts[5][:40] + [7, 8, 9], prompts[3][:32] + [11]]
    hits_before = llm.core.stats().prefix_cache_hit_tokens
    for prompt, result in zip(again, llm.generate(again, GREEDY, detokenize=False), strict=True):
        assert result.token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
    assert llm.core.stats().prefix_cache_hit_tokens > hits_before
    pair = llm.generate([prompts[2]], SamplingParams(n=2, temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                                   ignore_eos=True),
                        detokenize=False)[0]
    assert [o.token_ids for o in pair.outputs] == [hf_greedy(hf, prompts[2], NEW_TOKENS)] * 2
    llm.core.scheduler.check_invariants()


def test_bfloat16_logprobs_close_to_float32(folder: Path) -> None:
    """bfloat16 (weights, KV cache, products) against the float32 model on the same prompts: the
    float32 model's greedy token keeps a log probability within 0.25 nats of its float32 value at
    each of the first 8 steps (teacher-forced on the float32 tokens). The tiny models' weights are
    10x wider than real ones, which makes their bfloat16 rounding worse than a real model's."""
    prompts = random_prompts([9, 30], 512, seed=4)
    f32 = make_llm(folder, block_size=4, max_model_len=128)
    bf16 = make_llm(folder, block_size=4, max_model_len=128, dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0, ignore_eos=True)
    for prompt in prompts:
        tokens = f32.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                              detokenize=False)[0].token_ids
        for step in range(8):
            context = prompt + tokens[:step]
            want = f32.generate([context], params, detokenize=False)[0]
            assert want.token_ids == [tokens[step]]
            lp32 = want.outputs[0].logprobs[0].logprob
            lp16 = _logprob_of(bf16, context, tokens[step])
            assert abs(lp16 - lp32) < 0.25, f"step {step}: {lp16} vs {lp32}"


def _logprob_of(llm, context: list[int], token: int) -> float:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20, ignore_eos=True)
    out = llm.generate([context], params, detokenize=False)[0].outputs[0].logprobs[0]
    ranked = dict(zip(out.top_token_ids, out.top_logprobs, strict=True))
    assert token in ranked, "the float32 token fell out of bfloat16's top 20"
    return ranked[token]


@pytest.mark.parametrize(("architecture", "key", "value"), [
    ("llama", "hidden_act", "gelu"),
    ("llama", "mlp_bias", True),
    ("qwen2", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("gemma2", "use_bidirectional_attention", True),
    ("llama", "model_type", "falcon"),
])
def test_an_unsupported_knob_is_an_error_naming_its_key(architecture: str, key: str, value: object) -> None:
    cfg = {"model_type": architecture, "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, key: value}
    with pytest.raises(ModelConfigError, match=key.split("_")[0]):
        read_architecture(cfg)


def test_gemma3_multimodal_checkpoint_serves_its_text_part(tmp_path: Path) -> None:
    """`gemma3` folders (Gemma 3 4B and up): the language model's tensors under their saved names, the
    vision tower's read past; text prompts equal transformers' own multimodal model."""
    folder = tiny_gemma3_multimodal_folder(tmp_path)
    hf = _hf(folder)
    prompts = random_prompts([7, 30], 400, seed=5)
    llm = make_llm(folder, block_size=4, max_model_len=128)
    for prompt, result in zip(prompts, llm.generate(prompts, GREEDY, detokenize=False), strict=True):
        assert result.token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
