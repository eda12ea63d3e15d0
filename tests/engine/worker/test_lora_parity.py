"""LoRA must-show 1 on the tiny Llama: float32 greedy tokens of a batch mixing the base model and three
adapters (ranks 2, 4 and 8, different targets, rsLoRA on one) equal the same model with each adapter
merged into its weights, through our engine and through transformers; all prompts of the batch share a
prefix, with prefix caching on, so a block cached under one adapter reused under another shows up as a
different token. B = 0 gives exactly the base output; a reload under the same name never serves a
stale block.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.config import LoraConfig
from engine.llm import LLM
from engine.worker.lora.errors import LoraNotFound
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import (
    hf_greedy,
    hf_greedy_mismatch,
    make_llm,
    random_prompts,
    tiny_model,
)
from tests.support.lora_adapters import merged_folder, peft_adapter

__all__ = ["tiny_model"]

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ADAPTERS = {  # name -> (rank, alpha, targets, rslora)
    "all-r8": (8, 16.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), False),
    "qv-r2": (2, 4.0, ("q_proj", "v_proj"), False),
    "mlp-r4": (4, 8.0, ("o_proj", "gate_proj", "up_proj", "down_proj"), True),
}


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (PEFT folder, merged model folder)."""
    root = tmp_path_factory.mktemp("loras")
    out = {}
    for seed, (name, (rank, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        folder = peft_adapter(tiny_model, root / name, rank=rank, alpha=alpha, targets=targets, seed=seed,
                              rslora=rslora)
        out[name] = (folder, merged_folder(tiny_model, folder, root / f"{name}-merged"))
    return out


def _lora_llm(tiny_model: Path, modules: dict[str, Path], **kwargs) -> LLM:  # type: ignore[no-untyped-def]
    config = LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, p in modules.items()), max_loras=4)
    llm = LLM(str(tiny_model), "float32", num_device_blocks=96, num_cpu_blocks=32, block_size=4, lora=config,
              **kwargs)
    return llm


def test_mixed_batch_equals_merged_models(tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> None:
    shared = random_prompts([13], 512, seed=1)[0]  # three full blocks every request has in common
    tails = random_prompts([3, 7, 1, 5], 512, seed=2)
    names = ["", *ADAPTERS]
    prompts = [shared + tail for tail in tails for _ in names]
    loras = [name for _ in tails for name in names]
    llm = _lora_llm(tiny_model, {n: p for n, (p, _) in adapters.items()})
    got = llm.generate(prompts, GREEDY, detokenize=False, lora=loras)
    llm.core.scheduler.check_invariants()
    assert llm.core.stats().prefix_cache_hit_tokens > 0  # requests of the same adapter did share blocks
    for name in names:
        ref_folder = adapters[name][1] if name else tiny_model
        want = make_llm(ref_folder, blocks=96).generate(
            [p for p, n in zip(prompts, loras, strict=True) if n == name], GREEDY, detokenize=False)
        mine = [r.token_ids for r, n in zip(got, loras, strict=True) if n == name]
        assert mine == [r.token_ids for r in want], f"adapter {name or 'base'} differs from its merged model"
    hf = AutoModelForCausalLM.from_pretrained(adapters["all-r8"][1], dtype=torch.float32)
    first = loras.index("all-r8")
    assert got[first].token_ids == hf_greedy(hf, prompts[first], 16)


def test_zero_b_is_exactly_the_base_model(tiny_model: Path, tmp_path: Path) -> None:
    folder = peft_adapter(tiny_model, tmp_path / "zero", rank=4, alpha=8.0, zero_b=True)
    prompts = random_prompts([9, 4], 512, seed=3)
    llm = _lora_llm(tiny_model, {"zero": folder}, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    base = llm.generate(prompts, params, detokenize=False)
    zero = llm.generate(prompts, params, detokenize=False, lora="zero")
    for b, z in zip(base, zero, strict=True):
        assert b.token_ids == z.token_ids
        assert [lp.logprob for lp in b.outputs[0].logprobs] == [lp.logprob for lp in z.outputs[0].logprobs]


def test_reload_under_the_same_name_serves_no_stale_block(
        tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> None:
    prompt = random_prompts([17], 512, seed=4)[0]
    first, second = adapters["all-r8"], adapters["mlp-r4"]
    llm = _lora_llm(tiny_model, {"a": first[0]})
    assert llm.generate(prompt, GREEDY, detokenize=False, lora="a")[0].num_cached_tokens == 0
    again = llm.generate(prompt, GREEDY, detokenize=False, lora="a")[0]
    assert again.num_cached_tokens > 0  # the same load shares its blocks
    llm.core.load_lora("a", str(second[0]))  # same name, other weights
    reloaded = llm.generate(prompt, GREEDY, detokenize=False, lora="a")[0]
    assert reloaded.num_cached_tokens == 0
    want = make_llm(second[1], blocks=96).generate(prompt, GREEDY, detokenize=False)[0]
    assert reloaded.token_ids == want.token_ids
    llm.core.unload_lora("a")
    with pytest.raises(LoraNotFound):
        llm.generate(prompt, GREEDY, detokenize=False, lora="a")


def test_beams_and_best_of_under_an_adapter_equal_the_merged_model(
        tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> None:
    """Beam forks and best_of candidates run under their request's adapter (and share blocks cached
    under it only): each choice equals the same search on the merged model; base requests beside them
    equal the base model's."""
    name = "all-r8"
    folder, merged = adapters[name]
    beam = SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0.0, max_tokens=8, ignore_eos=True)
    best_of = SamplingParams(n=1, best_of=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    prompts = random_prompts([9, 6], 512, seed=3)
    llm = _lora_llm(tiny_model, {name: folder})
    for params in (beam, best_of):
        got = llm.generate(prompts * 2, params, detokenize=False, lora=[name, name, "", ""])
        llm.core.scheduler.check_invariants()
        for ref, results in ((merged, got[:2]), (tiny_model, got[2:])):
            want = make_llm(ref, blocks=96).generate(prompts, params, detokenize=False)
            assert [[o.token_ids for o in r.outputs] for r in results] == \
                [[o.token_ids for o in r.outputs] for r in want], f"{ref.name}, {params}"


SMOLLM2_ADAPTERS = {  # name -> (rank, alpha, targets)
    "all-r16": (16, 32.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    "qv-r4": (4, 8.0, ("q_proj", "v_proj")),
    "mlp-r8": (8, 16.0, ("o_proj", "gate_proj", "up_proj", "down_proj")),
}


@pytest.mark.slow
def test_smollm2_mixed_batch_equals_merged_models_on_the_cpp_loop(tmp_path: Path, hf_default_model: Any) -> None:
    """The must-show on the default model: float32 greedy tokens of a batch mixing the base model and three
    adapters of different ranks, prefix caching on (every prompt shares two blocks), equal Hugging Face's greedy
    tokens of the base model and of each adapter merged into it (peft's merge_and_unload); where this host runs
    the C++ layer loop, every step with adapter rows ran there (engine/worker/native_layers.py). Hugging Face's
    base model is the session's (each adapter is merged into a copy of it) and its greedy tokens are checked by
    teacher forcing (model_fixtures.hf_greedy_mismatch): one forward per model instead of one per token."""
    from peft import PeftModel

    from engine.worker.native_layers import NativeLayers
    from shared.model_store import resolve_model

    base = resolve_model("smollm2").path
    folders = {name: peft_adapter(base, tmp_path / name, rank=rank, alpha=alpha, targets=targets, seed=i, std=0.02)
               for i, (name, (rank, alpha, targets)) in enumerate(SMOLLM2_ADAPTERS.items())}
    shared = random_prompts([32], 49152, seed=5)[0]
    tails = random_prompts([7, 7], 49152, seed=6)  # one length: Hugging Face runs each model's two as one batch
    prompts = [shared + tail for tail in tails for _ in range(4)]
    loras = ["", *SMOLLM2_ADAPTERS] * 2
    config = LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, p in folders.items()), max_loras=3)
    llm = LLM(str(base), "float32", num_device_blocks=48, block_size=16, lora=config)
    native, ran = llm.core.runner.fast_forward, []
    if isinstance(native, NativeLayers):
        inner = native.forward
        native.forward = lambda inputs, lora=None: ran.append(out := inner(inputs, lora)) or out  # type: ignore[method-assign]
    got = llm.generate(prompts, GREEDY, detokenize=False, lora=loras)
    assert llm.core.stats().prefix_cache_hit_tokens > 0
    assert native is None or (ran and all(out is not None for out in ran))
    for name in ["", *SMOLLM2_ADAPTERS]:
        hf = hf_default_model
        if name:
            hf = PeftModel.from_pretrained(copy.deepcopy(hf), folders[name]).merge_and_unload()
        mine = [r.token_ids for r, n in zip(got, loras, strict=True) if n == name]
        assert all(len(tokens) == 16 for tokens in mine)
        theirs = [p for p, n in zip(prompts, loras, strict=True) if n == name]
        assert hf_greedy_mismatch(hf, theirs, mine) is None, name or "base"
