"""The scheduler inside the real EngineCore: preemption, prefix hits and n > 1 change no output.

Fast tests use a tiny random-weight Llama (tests/support/tiny_model.py); the `slow` ones load
the default model (SmolLM2-135M) and keep max_tokens tiny. `pageserve bench priority`
gets a smoke run on the tiny model here too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from shared.sampling import SamplingParams

Outputs = dict[tuple[str, int], list[int]]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: these models are tiny, and the CI machine's two cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.support.tiny_model import tiny_llama_folder

    return str(tiny_llama_folder(tmp_path_factory.mktemp("tiny-llama")))


def make_core(model: str, num_blocks: int, num_cpu_blocks: int = 64, **sched: object) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(model=model, dtype="float32"),
        cache=CacheConfig(block_size=4, num_device_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks),
        scheduler=SchedulerConfig(**({"max_num_seqs": 8, "max_num_batched_tokens": 64} | sched)),  # type: ignore[arg-type]
    )
    return EngineCore(config)


def run(core: EngineCore, requests: list[Request], check: bool = True) -> Outputs:
    for r in requests:
        core.add_request(r)
    outs: Outputs = {}
    while core.has_unfinished():
        for d in core.step():
            outs.setdefault((d.request_id, d.index), []).extend(d.new_token_ids)
        if check:
            core.scheduler.check_invariants()
    assert core.stats().free_device_blocks == core.stats().total_device_blocks
    return outs


def prompts(seed: int, count: int, lo: int, hi: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(count)]


def greedy(ps: list[list[int]], max_tokens: int, **kw: object) -> list[Request]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [Request(f"r{i}", p, params, 0.0, **kw) for i, p in enumerate(ps)]  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
def test_greedy_output_is_identical_with_and_without_preemption(tiny_model: str, mode: str) -> None:
    ps = prompts(0, 8, 5, 40, 500)
    want = run(make_core(tiny_model, 512), greedy(ps, 24))
    core = make_core(tiny_model, 24, preemption_mode=mode)
    assert run(core, greedy(ps, 24)) == want
    stats = core.stats()
    assert stats.preemptions >= 3
    assert (stats.swaps_out if mode != "recompute" else stats.recomputes) >= 1


def test_a_prefix_hit_gives_the_same_output_as_a_miss(tiny_model: str) -> None:
    system = prompts(1, 1, 24, 24, 500)[0]
    tails = prompts(2, 4, 2, 9, 500)
    outs = {}
    for caching in (False, True):
        core = make_core(tiny_model, 128, enable_prefix_caching=caching)
        first = run(core, greedy([system + tails[0]], 8))
        rest = run(
            core,
            [Request(f"t{i}", system + t, greedy([[1]], 8)[0].sampling, 0.0) for i, t in enumerate(tails)],
        )
        # All at once, with a prefix nobody computed yet: hits on blocks filled this very step.
        hits_before = core.stats().prefix_cache_hit_tokens
        together = run(core, greedy([system[::-1] + t for t in tails], 8))
        assert (core.stats().prefix_cache_hit_tokens - hits_before == 3 * 24) == caching
        outs[caching] = (first, rest, together)
        assert (core.stats().prefix_cache_hit_tokens > 0) == caching
    assert outs[True] == outs[False]


def test_n4_shares_prompt_blocks_and_each_sample_matches_its_seed_alone(tiny_model: str) -> None:
    prompt = prompts(3, 1, 30, 30, 500)[0]  # 30 tokens: 7 full blocks of 4 and a partial one
    params = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=42, ignore_eos=True)
    core = make_core(tiny_model, 128, enable_prefix_caching=False)
    core.add_request(Request("par", prompt, params, 0.0))
    outs: Outputs = {}
    used = []
    while core.has_unfinished():
        for d in core.step():
            outs.setdefault((d.request_id, d.index), []).extend(d.new_token_ids)
        used.append(core.stats().total_device_blocks - core.stats().free_device_blocks)
    # After the fork: 8 prompt blocks once, plus one copied partial block per other sample.
    assert used[1] == 8 + 3
    separate = make_core(tiny_model, 128, enable_prefix_caching=False, max_num_batched_tokens=128)
    for i in range(4):
        alone = SamplingParams(max_tokens=12, temperature=1.0, seed=42 + i, ignore_eos=True)
        separate.add_request(Request(f"alone{i}", prompt, alone, 0.0))
    separate.step()
    assert separate.stats().total_device_blocks - separate.stats().free_device_blocks == 4 * 8
    for i in range(4):
        alone = SamplingParams(max_tokens=12, temperature=1.0, seed=42 + i, ignore_eos=True)
        solo = run(make_core(tiny_model, 128), [Request("solo", prompt, alone, 0.0)])
        assert outs[("par", i)] == solo[("solo", 0)], f"sample {i}"
    assert len({tuple(v) for v in outs.values()}) > 1


@pytest.mark.slow
def test_default_model_greedy_identical_under_preemption() -> None:
    ps = prompts(4, 4, 20, 40, 49000)
    want = run(make_core("smollm2", 1024), greedy(ps, 8), check=False)
    for mode in ("swap", "recompute"):
        core = make_core("smollm2", 16, preemption_mode=mode, max_num_batched_tokens=48)
        assert run(core, greedy(ps, 8), check=False) == want, mode
        assert core.stats().preemptions >= 1


@pytest.mark.slow
def test_default_model_n4_uses_the_prompt_blocks_once() -> None:
    prompt = prompts(5, 1, 64, 64, 49000)[0] + [1]  # 65 tokens: 16 full blocks of 4 + 1
    params = SamplingParams(n=4, max_tokens=4, temperature=0.8, seed=7, ignore_eos=True)
    core = make_core("smollm2", 256, enable_prefix_caching=False, max_num_batched_tokens=128)
    core.add_request(Request("par", prompt, params, 0.0))
    core.step()
    core.step()
    # The followers share all 17 prompt blocks (position 64 starts a fresh block): no copies.
    used = core.stats().total_device_blocks - core.stats().free_device_blocks
    assert used == 17 + 3
    while core.has_unfinished():
        core.step()


def test_bench_priority_runs_every_request_of_every_run(
    tiny_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ops.bench import priority

    out = tmp_path / "bench.json"
    args = ["--model", tiny_model, "--vocab", "500", "--threads", "1", "--low", "3", "--low-prompt", "16"]
    args += ["--low-output", "8", "--urgent", "2", "--urgent-start", "0", "--urgent-every", "0.01"]
    args += ["--max-num-seqs", "2", "--device-blocks", "32", "--pressure-requests", "4"]
    args += ["--pressure-output", "8", "--pressure-blocks", "16", "--json", str(out)]
    assert priority.main(args) == 0
    report = json.loads(out.read_text())
    names = [r["name"] for r in report["runs"]]
    assert names == ["fcfs", "priority", "pressure/swap", "pressure/recompute", "pressure/auto"]
    for run in report["runs"][:2]:  # every request of every run completed
        assert run["output_tokens"] == 3 * 8 + 2 * 8
        assert sorted(run["ttft"]) == [f"{run['name']}-urgent0", f"{run['name']}-urgent1"]
    for run in report["runs"][2:]:
        assert run["output_tokens"] == 4 * 8
    text = capsys.readouterr().out
    assert "urgent p99 TTFT" in text and "pressure/recompute" in text
