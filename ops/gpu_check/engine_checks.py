"""The engine on the checked device: greedy parity with the CPU path, graphs, sampling, a decode sweep, a profile.

Each function prints its own lines and returns True when its check passed.
The engine under test is `LLM(device=...)` with the Triton backend; the
reference is the CPU engine (torch backend, float32) on the same weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from ops.gpu_check.triton_counters import CompileCounter
from shared.sampling import SamplingParams


@dataclass(frozen=True)
class Setup:
    model: str
    device: str
    max_num_batched_tokens: int
    max_num_seqs: int
    parity_tokens: int
    sweep_tokens: int


def make_llm(setup: Setup, dtype: str, device: str, backend: str, eager: bool = False) -> LLM:
    scheduler = SchedulerConfig(max_num_batched_tokens=setup.max_num_batched_tokens,
                                max_num_seqs=setup.max_num_seqs, max_model_len=setup.sweep_tokens + 64)
    return LLM(model=setup.model, dtype=dtype, device=device, attention_backend=backend, scheduler=scheduler,
               kv_cache_memory=256 << 20, num_cpu_blocks=8, enforce_eager=eager)


def prompts(n: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for length in (3, 5, 4, 2)[:n]]


def greedy(llm: LLM, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [r.token_ids for r in llm.generate(batch, params, detokenize=False)]


def first_divergence(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        k = next((j for j, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), None)
        if k is not None:
            return f"prompt {i} differs from token {k} of {len(x)}"
    return "identical"


def check_parity(setup: Setup) -> bool:
    """float32 must give the CPU path's greedy tokens; bfloat16's agreement is reported."""
    cpu = make_llm(setup, "float32", "cpu", "torch")
    batch = prompts(4, cpu.model_info.vocab_size)
    expected = greedy(cpu, batch, setup.parity_tokens)
    ok = True
    for dtype in ("float32", "bfloat16"):
        llm = make_llm(setup, dtype, setup.device, "triton")
        print(f"  warm-up compiled {len(llm.core.kernel_variants)} paged-attention variants ({dtype}):")
        for v in llm.core.kernel_variants:
            print(f"    {v.describe()}")
        got = greedy(llm, batch, setup.parity_tokens)
        verdict = first_divergence(expected, got)
        print(f"  {dtype} on {setup.device} vs CPU float32 greedy: {verdict}")
        ok &= dtype != "float32" or verdict == "identical"
        if torch.device(setup.device).type == "cuda":
            eager = greedy(make_llm(setup, dtype, setup.device, "triton", eager=True), batch, setup.parity_tokens)
            graph_verdict = first_divergence(eager, got)
            print(f"  {dtype} CUDA graphs vs eager: {graph_verdict}")
            ok &= graph_verdict == "identical"
        del llm
    return ok


def check_default_sampling(setup: Setup) -> bool:
    """A request with the default SamplingParams (temperature 1.0) on the device."""
    llm = make_llm(setup, "float32", setup.device, "triton")
    result = llm.generate([prompts(1, llm.model_info.vocab_size)[0]], SamplingParams(max_tokens=8, ignore_eos=True),
                          detokenize=False)[0]
    print(f"  default sampling: {len(result.token_ids)} tokens, finish_reason={result.finish_reason}")
    return len(result.token_ids) == 8


def check_decode_sweep(setup: Setup, slow_ms: float = 50.0) -> bool:
    """One request decoding 1..N tokens: steps slower than slow_ms, and compilations after start-up."""
    llm = make_llm(setup, "bfloat16", setup.device, "triton")
    counter = CompileCounter()
    params = SamplingParams(max_tokens=setup.sweep_tokens, temperature=0.0, ignore_eos=True)
    from engine.request import Request

    llm.core.add_request(Request("sweep", [5, 6, 7], params, arrival_time=0.0))
    slow, times, step = [], [], 0
    while llm.core.has_unfinished():
        start = time.perf_counter()
        llm.core.step()
        if torch.device(setup.device).type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        times.append(ms)
        if ms > slow_ms:
            slow.append((step, ms))
        step += 1
    compiled = counter.count()
    times.sort()
    print(f"  decode sweep: {step} steps to {setup.sweep_tokens} tokens, median {times[len(times) // 2]:.2f} ms, "
          f"max {times[-1]:.2f} ms, {len(slow)} over {slow_ms:.0f} ms {slow[:5]}")
    print(f"  compilations during the sweep: {compiled if compiled is not None else 'n/a (interpreter)'}")
    return not compiled


def profile_decode_step(setup: Setup) -> bool:
    """Wall time of one decode step against the device time of its kernels."""
    from torch.profiler import ProfilerActivity, profile

    llm = make_llm(setup, "bfloat16", setup.device, "triton")
    batch = prompts(4, llm.model_info.vocab_size)
    from engine.request import Request

    for i, p in enumerate(batch):
        llm.core.add_request(Request(f"p{i}", p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                                     arrival_time=0.0))
    llm.core.step()  # the prompts; the next step is decode-only
    cuda = torch.device(setup.device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        llm.core.step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    events = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:5]
    print(f"  one decode step of 4: wall {wall_ms:.2f} ms, device kernels {device_us / 1e3:.2f} ms"
          f"{'' if cuda else ' (no device)'}")
    print("  top host ops: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3:.2f} ms" for e in top))
    return True
