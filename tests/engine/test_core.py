"""EngineCore and the offline LLM on a tiny random Llama: API shape, finish reasons, seeds, no leaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.request_checks import RequestRejected
from shared.model_info import ModelInfo
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, random_prompts, tiny_model

__all__ = ["tiny_model"]


def assert_nothing_held(core: EngineCore) -> None:
    core.step()  # hands the last finished ids to the runner
    core.scheduler.check_invariants()
    stats = core.stats()
    assert (stats.running, stats.waiting, stats.swapped) == (0, 0, 0)
    assert stats.free_device_blocks == stats.total_device_blocks
    assert stats.free_cpu_blocks == stats.total_cpu_blocks
    assert core.runner.sampler.num_generators == 0
    assert not core.has_unfinished()


def test_model_info(tiny_model: Path) -> None:
    core = EngineCore(EngineConfig(
        model=ModelConfig(str(tiny_model), dtype="float32", max_model_len=300),
        cache=CacheConfig(block_size=8, num_device_blocks=50, num_cpu_blocks=0),
    ))
    assert core.model_info == ModelInfo(model_name=core.model_info.model_name, max_model_len=300, block_size=8,
                                        eos_token_id=2, num_blocks=50, vocab_size=512)
    assert core.model_path == tiny_model.resolve() and core.dtype == "float32"


def test_model_info_carries_the_resolved_sampling_defaults(tiny_model: Path) -> None:
    """The one record is built once, by the core: the --default-sampling overrides are in it."""
    core = EngineCore(EngineConfig(
        model=ModelConfig(str(tiny_model), dtype="float32"), cache=CacheConfig(block_size=8, num_device_blocks=8),
        default_sampling='{"temperature": 0.3}',
    ))
    assert core.model_info.sampling_defaults()["temperature"] == 0.3


def test_generate_mixes_strings_free_ids_and_keeps_prompt_order(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    prompts = random_prompts([9, 2, 30], 512)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 11, 6)]
    results = llm.generate(prompts, params, detokenize=False)
    assert [len(r.token_ids) for r in results] == [3, 11, 6]
    assert [r.prompt_token_ids for r in results] == prompts
    assert all(r.finish_reason == "length" for r in results)
    assert_nothing_held(llm.core)


def test_stop_token_and_eos_end_with_stop(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    prompt = random_prompts([12], 512)[0]
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), detokenize=False)[0]
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(stop_at,)), detokenize=False
    )[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]
    held = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=20, min_tokens=first + 1, stop_token_ids=(stop_at,),
                                 ignore_eos=True), detokenize=False,
    )[0]
    assert len(held.token_ids) > first + 1 and stop_at not in held.token_ids[: first + 1]
    assert_nothing_held(llm.core)


def test_seeded_sampling_is_independent_of_the_batch(tiny_model: Path) -> None:
    prompt = random_prompts([15], 512, seed=4)[0]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=123, max_tokens=24, ignore_eos=True)
    alone = make_llm(tiny_model).generate([prompt], seeded, detokenize=False)[0].token_ids
    others = random_prompts([40, 3, 22], 512, seed=5)
    crowd = make_llm(tiny_model, budget=16).generate(
        [*others, prompt], [SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True)] * 3 + [seeded],
        detokenize=False,
    )[3].token_ids
    assert alone == crowd
    other_seed = make_llm(tiny_model).generate(
        [prompt], SamplingParams(temperature=1.0, top_p=0.9, seed=124, max_tokens=24, ignore_eos=True),
        detokenize=False,
    )[0].token_ids
    assert other_seed != alone


def test_n_samples_share_the_prompt_and_differ(tiny_model: Path) -> None:
    llm = make_llm(tiny_model)
    result = llm.generate(random_prompts([20], 512), SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=12,
                                                                      ignore_eos=True), detokenize=False)[0]
    assert [o.index for o in result.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 12 and o.finish_reason == "length" for o in result.outputs)
    assert len({tuple(o.token_ids) for o in result.outputs}) == 3
    assert_nothing_held(llm.core)


def test_abort_mid_generation_frees_everything(tiny_model: Path) -> None:
    llm = make_llm(tiny_model, blocks=30, budget=16)
    core = llm.core
    for i, prompt in enumerate(random_prompts([25, 7, 40], 512)):
        core.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=50, seed=i), arrival_time=0.0))
    for _ in range(6):
        core.step()
    deltas = core.abort_requests(["r0", "r2", "unknown"])
    assert {d.request_id for d in deltas} == {"r0", "r2"} and all(d.finish_reason == "abort" for d in deltas)
    while core.has_unfinished():
        core.step()
    assert_nothing_held(core)


def test_bad_requests_are_rejected_with_a_typed_error(tiny_model: Path) -> None:
    llm = make_llm(tiny_model, max_model_len=64)
    with pytest.raises(RequestRejected):
        llm.core.add_request(Request("empty", [], SamplingParams(), arrival_time=0.0))
    with pytest.raises(RequestRejected):
        llm.core.add_request(Request("long", [5] * 64, SamplingParams(), arrival_time=0.0))
    with pytest.raises(ValueError):
        llm.generate([[5, 6]], [SamplingParams(), SamplingParams()])
    vocab = llm.core.model_info.vocab_size
    # Ids that would index past the logits (the sampler masks stop ids while min_tokens holds).
    for field, req in [
        ("prompt", Request("oov", [5, vocab], SamplingParams(), arrival_time=0.0)),
        ("stop_token_ids", Request("stop", [5], SamplingParams(stop_token_ids=(vocab,), min_tokens=1),
                                   arrival_time=0.0)),
    ]:
        with pytest.raises(RequestRejected, match="outside the vocabulary") as caught:
            llm.core.add_request(req)
        assert caught.value.param == field
    assert not llm.core.has_unfinished()


def test_scheduler_budget_is_honoured_by_the_runner(tiny_model: Path) -> None:
    """A 100-token prompt with a 16-token budget is prefilled over 7 steps and still samples once."""
    llm = make_llm(tiny_model, budget=16)
    core = llm.core
    core.add_request(Request("p", random_prompts([100], 512)[0], SamplingParams(max_tokens=2, ignore_eos=True), 0.0))
    steps_until_first_token = 0
    while True:
        steps_until_first_token += 1
        deltas = core.step()
        assert core.stats().last_step_num_tokens <= 16
        if deltas:
            break
    assert steps_until_first_token == 7 and deltas[0].new_token_ids


def test_scheduler_config_passes_through(tiny_model: Path) -> None:
    cfg = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64, enable_prefix_caching=False)
    core = EngineCore(EngineConfig(model=ModelConfig(str(tiny_model)), cache=CacheConfig(num_device_blocks=40,
                                                                                        num_cpu_blocks=0),
                                   scheduler=cfg))
    assert core.scheduler.config.max_num_seqs == 3 and core.scheduler.config.max_model_len == 1024


def test_each_step_reports_its_time_to_the_schedulers_cost_model(tiny_model: Path) -> None:
    """The serving time budget learns from real steps: decode-only ones and ones carrying a prompt.

    The prompt step carries the first guess's 64 tokens (FIRST_PROMPT_TOKENS) beside one decode, ~1.8x a
    decode step here, and the yardstick is the median of eight decode steps: 15 tokens measured against two
    decode steps, a cold first one among them, once ran in 0.9x under CI's load, and a step no slower than
    the yardstick teaches nothing."""
    llm = make_llm(tiny_model, blocks=128, budget=256, prefill_stall_factor=2.0, max_prefill_tokens_while_decoding=192)
    core = llm.core
    costs = core.scheduler.step_costs
    prompts = random_prompts([4, 192], 512)
    core.add_request(Request("a", prompts[0], SamplingParams(max_tokens=30, ignore_eos=True), 0.0))
    for _ in range(9):
        core.step()  # prompt, then decodes only: their median, not a cold first one, is the yardstick
    assert costs.decode_step_s is not None and costs.decode_step_s > 0 and costs.budget is None
    core.add_request(Request("b", prompts[1], SamplingParams(max_tokens=2, ignore_eos=True), 0.0))
    core.step()  # a's decode beside b's prompt
    assert core.stats().last_step_num_tokens > 16, "the prompt must share the step with a's decode"
    assert costs.prompt_stalls and costs.prompt_stalls[-1] > 1.0 and costs.budget is not None
