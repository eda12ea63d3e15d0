"""Beam search on the real engine: the beams equal transformers' `generate(num_beams=...)`, and
they live on shared blocks (counted here, not inferred from the outputs).

Settings compared exactly (float32, width 4, n = 4 returned, best first):
  * ignore_eos with max_tokens: every hypothesis ends at max length, so length_penalty and
    early_stopping cannot change the ranking; tested with (1.0, False), (0.0, True), (2.0, "never");
  * a stop token (transformers' eos_token_id) that beams reach early: hypotheses of different
    lengths, where length_penalty and early_stopping decide; tested with (1.0, False), (0.0, True),
    (-1.0, False), (0.5, "never").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm import LLM, BeamSearchParams
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, random_prompts, tiny_model

__all__ = ["tiny_model"]

WIDTH = 4


def hf_beams(model: Any, prompt: list[int], max_new_tokens: int, length_penalty: float,
             early_stopping: bool | str, stop: int | None) -> list[list[int]]:
    """transformers' beam search, one prompt, all beams returned best first (cut after the stop token)."""
    ids = torch.tensor([prompt])
    model.generation_config.eos_token_id = stop  # None: no EOS at all, as ignore_eos
    out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=WIDTH, num_return_sequences=WIDTH,
                         max_new_tokens=max_new_tokens, do_sample=False, length_penalty=length_penalty,
                         early_stopping=early_stopping, pad_token_id=0)
    beams = [o[len(prompt):].tolist() for o in out]
    return [b[: b.index(stop) + 1] if stop in b else b for b in beams]


@pytest.fixture(scope="module")
def engines(tiny_model: Path) -> tuple[LLM, Any]:
    from transformers import AutoModelForCausalLM

    return (make_llm(tiny_model, blocks=64, block_size=4, budget=64),
            AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


@pytest.mark.parametrize(("length_penalty", "early_stopping"), [(1.0, False), (0.0, True), (2.0, "never")])
def test_beams_equal_transformers_with_ignore_eos(engines: tuple[LLM, Any], length_penalty: float,
                                                  early_stopping: bool | str) -> None:
    llm, hf = engines
    prompts = random_prompts([5, 9, 13], 512)
    params = BeamSearchParams(beam_width=WIDTH, max_tokens=6, ignore_eos=True, length_penalty=length_penalty,
                              early_stopping=early_stopping)
    results = llm.beam_search(prompts, params, detokenize=False)
    for prompt, result in zip(prompts, results, strict=True):
        assert [o.token_ids for o in result.outputs] == hf_beams(hf, prompt, 6, length_penalty, early_stopping, None)
        assert {o.finish_reason for o in result.outputs} == {"length"}


@pytest.mark.parametrize(("length_penalty", "early_stopping"), [(1.0, False), (0.0, True), (-1.0, False),
                                                                 (0.5, "never")])
def test_beams_that_stop_early_equal_transformers(engines: tuple[LLM, Any], length_penalty: float,
                                                  early_stopping: bool | str) -> None:
    llm, hf = engines
    prompts = random_prompts([5, 9, 13], 512)
    stops = [61, 41, 50]  # tokens some beams of these prompts produce within a few steps
    lengths = set()
    for prompt, stop in zip(prompts, stops, strict=True):
        params = SamplingParams(n=WIDTH, use_beam_search=True, temperature=0, max_tokens=8, stop_token_ids=(stop,),
                                ignore_eos=True, length_penalty=length_penalty, early_stopping=early_stopping)
        result = llm.generate([prompt], params, detokenize=False)[0]
        got = [o.token_ids for o in result.outputs]
        assert got == hf_beams(hf, prompt, 8, length_penalty, early_stopping, stop)
        lengths |= {len(g) for g in got}
    assert len(lengths) > 1  # hypotheses of different lengths: the penalty and the stopping rule mattered


def distinct_held(llm: LLM) -> int:
    return sum(b.ref_cnt > 0 for b in llm.core.scheduler.bm.device.blocks)


def test_beams_share_blocks_and_pruned_beams_free_theirs(tiny_model: Path) -> None:
    llm = make_llm(tiny_model, blocks=64, block_size=4, budget=64, enable_prefix_caching=False)
    sched = llm.core.scheduler
    prompt = random_prompts([8], 512)[0]  # two full blocks of 4
    llm.core.add_request(_request("b", prompt, max_tokens=7))
    llm.core.step()  # the leader prefills and reports; the first expansion forks 4 beams
    beams = [sched._live[f"b#{i}"].req for i in range(WIDTH)]
    assert all(b.block_ids == beams[0].block_ids for b in beams)  # one copy of the prompt for four beams
    assert distinct_held(llm) == 2
    llm.core.step()  # each beam writes position 8 into a block of its own; then the expansion
    # prunes some and forks others from the survivors, who share their tail with their forks
    assert all(b.block_ids[:2] == beams[0].block_ids[:2] for b in beams)
    tails = {b.block_ids[2] for b in beams}
    assert distinct_held(llm) == 2 + len(tails) <= 2 + WIDTH  # separate requests would hold 4 x 3 = 12
    forks = 0
    while sched.has_unfinished():
        deltas = llm.core.step()
        sched.check_invariants()  # reference counts equal the live tables: a pruned beam kept nothing
        live = list(sched.running)
        if live:
            held = {b for r in live for b in r.block_ids}
            assert distinct_held(llm) == len(held) < WIDTH * len(live[0].block_ids)
            assert all(r.block_ids[:2] == live[0].block_ids[:2] for r in live)  # the prompt stays shared
            # Beams sharing their last block: a pruned slot was reused to fork a survivor's table.
            forks += len({r.block_ids[-1] for r in live}) < len(live)
        if deltas:
            assert len(deltas) == WIDTH and all(len(d.new_token_ids) == 7 for d in deltas)
    assert forks > 0  # some beam took over another's blocks (a pruned slot reused for a fork)
    assert distinct_held(llm) == 0 and sched.bm.num_free_device_blocks == 64  # nothing leaks


def _request(rid: str, prompt: list[int], max_tokens: int):  # type: ignore[no-untyped-def]
    from engine.request import Request

    params = SamplingParams(n=WIDTH, use_beam_search=True, temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, prompt, params, arrival_time=0.0)


@pytest.mark.slow
def test_default_model_beams_equal_transformers(hf_default_model: Any) -> None:
    """transformers' model is the session's (model_fixtures.hf_default_model), loaded once for every test."""
    from shared.model_store import resolve_model

    llm = make_llm(resolve_model("smollm2").path, blocks=64, block_size=16, budget=256)
    hf = hf_default_model
    prompts = [llm.tokenizer.encode(p) for p in ("The capital of France is", "def fibonacci(n):",
                                                  "Once upon a time, a small robot")]
    # One setting: with ignore_eos every beam ends at max_tokens, so the length penalty and early stopping
    # cannot change the ranking here (a second setting ran the same search twice, ~30 s); the knobs are
    # checked on the tiny model above, with and without a stop token.
    params = BeamSearchParams(beam_width=WIDTH, max_tokens=12, ignore_eos=True, length_penalty=1.0,
                              early_stopping=False)
    for prompt, result in zip(prompts, llm.beam_search(prompts, params, detokenize=False), strict=True):
        assert [o.token_ids for o in result.outputs] == hf_beams(hf, prompt, 12, 1.0, False, None)
