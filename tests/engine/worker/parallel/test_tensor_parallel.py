"""Tensor parallel size 2 (two processes, gloo) against size 1: the same greedy tokens, with prefix
caching, swap preemption and n > 1 (copy-on-write), and no worker left behind.

The tiny model is split unevenly on purpose (3 KV heads over 2 ranks, an odd MLP width and vocabulary)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.llm import LLM
from engine.outputs import SchedulerOutput
from engine.scheduling.config import SchedulerConfig
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts
from tests.support.tiny_model import tiny_folder, tiny_llama_folder

pytestmark = pytest.mark.slow

VOCAB = 511
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _llm(model: Path | str, tp: int, blocks: int = 40) -> LLM:
    sched = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, preemption_mode="swap")
    return LLM(str(model), "float32", num_device_blocks=blocks, num_cpu_blocks=64, block_size=4, scheduler=sched,
               tensor_parallel_size=tp)


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in llm.generate(prompts, params, detokenize=False)]


def _record_steps(llm: LLM) -> list[SchedulerOutput]:
    """Every step rank 0 sends to the workers, from now on."""
    steps: list[SchedulerOutput] = []
    send = llm.core.runner.before_step
    assert send is not None

    def record(out: SchedulerOutput) -> None:
        steps.append(out)
        send(out)

    llm.core.runner.before_step = record
    return steps


@pytest.fixture(scope="module")
def uneven_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_folder(tmp_path_factory.mktemp("tp-tiny"), hidden_size=48, num_heads=6, num_kv_heads=3,
                             intermediate_size=161, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def pair(uneven_model: Path) -> Iterator[tuple[LLM, LLM]]:
    threads = torch.get_num_threads()  # rank 0 takes its share of the cores: give them back afterwards
    one, two = _llm(uneven_model, 1), _llm(uneven_model, 2)
    yield one, two
    two.close()
    torch.set_num_threads(threads)


def test_greedy_tokens_equal_size_one(pair: tuple[LLM, LLM]) -> None:
    prompts = random_prompts([5, 9, 13, 7], VOCAB, seed=1)
    one, two = pair
    assert _tokens(two, prompts) == _tokens(one, prompts)


def test_prefix_cache_hits_and_the_same_tokens(pair: tuple[LLM, LLM]) -> None:
    one, two = pair
    prefix = random_prompts([16], VOCAB, seed=2)[0]
    prompts = [prefix + [5, 6, 7], prefix + [8, 9]]
    first = two.generate(prompts[:1], GREEDY, detokenize=False)[0]
    second = two.generate(prompts[1:], GREEDY, detokenize=False)[0]
    assert second.num_cached_tokens >= 16 > first.num_cached_tokens
    assert [first.token_ids, second.token_ids] == [r[0] for r in _tokens(one, prompts)]


def test_swap_preemption_moves_every_ranks_blocks(pair: tuple[LLM, LLM]) -> None:
    one, two = pair
    steps = _record_steps(two)
    prompts = random_prompts([14, 15, 16, 17, 18, 19, 20, 21], VOCAB, seed=3)  # ~32 tokens each, 40 blocks of 4
    long = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    assert _tokens(two, prompts, long) == _tokens(one, prompts, long)
    assert any(s.blocks_to_swap_out for s in steps) and any(s.blocks_to_swap_in for s in steps)


def test_n_samples_copy_on_write(pair: tuple[LLM, LLM]) -> None:
    one, two = pair
    steps = _record_steps(two)
    prompts = random_prompts([6, 10], VOCAB, seed=4)  # partial last blocks: the samples copy them on write
    params = SamplingParams(n=3, max_tokens=8, temperature=0, ignore_eos=True)
    got = _tokens(two, prompts, params)
    assert got == _tokens(one, prompts, params)
    assert all(len(set(map(tuple, samples))) == 1 for samples in got)  # greedy: every sample the same
    assert any(s.blocks_to_copy for s in steps)


def test_workers_exit_on_close(uneven_model: Path) -> None:
    threads = torch.get_num_threads()
    llm = _llm(uneven_model, 2)
    workers = list(llm.core.parallel.workers)  # type: ignore[union-attr]
    assert all(w.poll() is None for w in workers)
    llm.close()
    torch.set_num_threads(threads)
    assert [w.poll() for w in workers] == [0]  # stopped when told, and cleanly (no abort at exit)


RANK0 = """
import sys, time
from engine.llm import LLM
llm = LLM(sys.argv[1], "float32", num_device_blocks=8, block_size=4, tensor_parallel_size=2)
print(*llm.core.parallel.worker_pids, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_exit_when_rank_0_is_killed(uneven_model: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    rank0 = subprocess.Popen([sys.executable, "-c", RANK0, str(uneven_model)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        pids = [int(p) for p in rank0.stdout.readline().split()]  # type: ignore[union-attr]
        assert pids and all(_alive(p) for p in pids)
        rank0.send_signal(signal.SIGKILL)  # no atexit, no goodbye: only the closed pipe tells the worker
        rank0.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        rank0.kill()
        rank0.wait(10)


def test_default_model_greedy_tokens_equal_size_one() -> None:
    """SmolLM2-135M: 9 query heads over 3 KV heads, split 6 + 3 on two ranks."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "Water boils at"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    threads = torch.get_num_threads()
    sched = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8)
    two = LLM("smollm2", "float32", num_device_blocks=32, scheduler=sched, tensor_parallel_size=2)
    try:
        got = [r.token_ids for r in two.generate(prompts, params)]
    finally:
        two.close()
        torch.set_num_threads(threads)
    one = LLM("smollm2", "float32", num_device_blocks=32, scheduler=sched)
    assert got == [r.token_ids for r in one.generate(prompts, params)]


@pytest.mark.parametrize("architecture", ["gemma3_text", "qwen2_moe", "phi3"])
def test_other_architectures_shard_to_the_same_tokens(architecture: str, tmp_path: Path) -> None:
    """The options' own weights split right: q/k norms, Gemma's four norms and local rotary, Phi-3's fused
    projections and partial rotary, Qwen2-MoE's q/k/v biases, experts and gated shared expert."""
    folder = tiny_folder(architecture, tmp_path)
    prompts = random_prompts([5, 19, 13], 512, seed=3)
    threads = torch.get_num_threads()
    one, two = _llm(folder, 1), _llm(folder, 2)
    try:
        assert _tokens(two, prompts) == _tokens(one, prompts)
    finally:
        two.close()
        torch.set_num_threads(threads)
