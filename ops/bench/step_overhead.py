"""`pageserve bench step-overhead`: the Python and torch glue of one decode step, kernels excluded.

    pageserve bench step-overhead [--dtype auto] [--running 64] [--context 200] [--steps 10] [--rounds 4]
                                  [--threads 2]

`--running` requests with `--context`-token prompts are prefilled, then decode-only steps of
EngineCore.step are timed twice, alternately in rounds (a busy host slows both alike):
  plain         nothing patched: the step as the engine runs it
  instrumented  every kernel call timed (the boundary below), and each stage's wall time
glue = instrumented step - its kernels; the instrumented step minus the plain one is what the
timers themselves cost (about a microsecond a call), so the glue printed is an upper bound.

Kernels (the boundary): the C kernels' ctypes calls (fused ops, decode attention, panel GEMM,
greedy argmax, near-maximum scan), oneDNN's and torch's products (`mkldnn._linear_pointwise`,
`F.linear`), the KV cache write (`store_kv`: one C row copy, or torch's index_copy_), the embedding gather. Everything
else is glue: our Python, torch's dispatch of views and small ops, allocations, and the logits'
float32 copy. Stages: schedule, inputs (build_step_inputs), forward (the layers), logits
(final norm, vocab product, exact near-maximum), sample, update, other (EngineCore.step's own).
A benchmark, not a test: the target (issue 13) is at most 3 ms of glue at 64 running requests.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

import engine.worker.model_runner as model_runner
from engine.core import EngineCore
from engine.llm import LLM
from engine.request import Request
from engine.worker.native_layers import NativeLayers
from pageserve_kernels import cpu_attention, cpu_decode, cpu_fused, cpu_fused_bf16, cpu_gemm
from shared.gc_pauses import freeze_startup_objects
from shared.sampling import SamplingParams

STAGES = ("schedule", "inputs", "forward", "logits", "sample", "update")


class Clock:
    """Wall time per stage and kernel time per stage and per kernel, for the steps it watched."""

    def __init__(self) -> None:
        self.stage = "other"
        self.stage_s: dict[str, float] = defaultdict(float)
        self.kernel_in_stage_s: dict[str, float] = defaultdict(float)
        self.kernel_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.in_kernel = False

    def kernel(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A kernel called from inside another (the C KV write inside store_kv) counts as the outer one."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.in_kernel:
                return fn(*args, **kwargs)
            self.in_kernel = True
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                self.in_kernel = False
                self.kernel_s[name] += spent
                self.kernel_in_stage_s[self.stage] += spent
                self.calls[name] += 1
        return timed

    def add_kernels(self, times: dict[str, tuple[float, int]]) -> None:
        """Kernels timed elsewhere (inside the C++ layers: engine/worker/native_layers.py), in the current stage:
        seconds and calls by name."""
        for name, (spent, calls) in times.items():
            if not calls:
                continue  # a kind this step had none of (prompt attention in a decode step)
            self.kernel_s[name] += spent
            self.kernel_in_stage_s[self.stage] += spent
            self.calls[name] += calls

    def staged(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wall time of `name` excluding stages nested in it (they count as their own)."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            outer, self.stage = self.stage, name
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                self.stage_s[name] += spent
                self.stage_s[outer] -= spent
                self.stage = outer
        return timed


@contextlib.contextmanager
def patched(pairs: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]) -> Iterator[None]:
    """Each (owner, attribute, wrap): owner.attribute = wrap(owner.attribute) (dicts: the key), then back."""
    saved = []
    for owner, name, wrap in pairs:
        old = owner[name] if isinstance(owner, dict) else getattr(owner, name)
        saved.append((owner, name, old))
        if isinstance(owner, dict):
            owner[name] = wrap(old)
        else:
            setattr(owner, name, wrap(old))
    try:
        yield
    finally:
        for owner, name, old in reversed(saved):
            if isinstance(owner, dict):
                owner[name] = old
            else:
                setattr(owner, name, old)


def instrumentation(core: EngineCore, clock: Clock) -> list[tuple[Any, str, Callable[..., Any]]]:
    """What `patched` wraps: every kernel entry (the module docstring's boundary) and every stage."""
    def k(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda fn: clock.kernel(name, fn)

    def s(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda fn: clock.staged(name, fn)

    pairs: list[tuple[Any, str, Callable[..., Any]]] = []
    for native in (cpu_fused.load(), cpu_fused_bf16.load()):
        if native is not None:
            pairs += [(native._fn, op, k(f"C {op}")) for op in native._fn]
    decode = cpu_decode.load()
    if decode is not None:
        pairs += [(decode._fns, dtype, k("C decode attention")) for dtype in decode._fns]
    for gemm in (cpu_gemm.load(torch.float32), cpu_gemm.load(torch.bfloat16)):
        if gemm is not None:
            pairs.append((gemm, "_fn", k("C panel GEMM")))
    pairs += [(torch.ops.mkldnn, "_linear_pointwise", k("oneDNN linear")), (F, "linear", k("torch linear")),
              (F, "embedding", k("embedding")), (cpu_attention, "store_kv", k("KV cache write"))]
    model, runner = core.runner.model, core.runner
    if isinstance(runner.fast_forward, NativeLayers):
        pairs.append((runner.fast_forward, "forward", lambda fn: clock.staged("forward", native_timed(fn, clock))))
    pairs += [(core.scheduler, "schedule", s("schedule")), (core.scheduler, "update", s("update")),
              (model_runner, "build_step_inputs", s("inputs")), (model, "forward", s("forward")),
              (model, "compute_logits", s("logits")), (runner.sampler, "sample_with_logprobs", s("sample"))]
    return pairs


def native_timed(forward: Callable[..., Any], clock: Clock) -> Callable[..., Any]:
    """The C++ layers' forward, its kernels timed inside it and added to the clock."""
    native = forward.__self__  # type: ignore[attr-defined]

    def timed(*args: Any) -> Any:
        native.time_kernels()
        try:
            return forward(*args)
        finally:
            clock.add_kernels(native.kernel_times())
    return timed


def decoding_core(llm: LLM, running: int, context: int) -> EngineCore:
    """The engine with `running` requests past their prompts, each able to decode for thousands of steps."""
    core = llm.core
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    vocab = core.model_info.vocab_size or 32_000
    for i in range(running):
        core.add_request(Request(f"r{i}", [rng.randrange(vocab // 50, vocab * 4 // 5) for _ in range(context)],
                                 params, arrival_time=0.0))
    for _ in range(10_000):
        out = core.scheduler.schedule()
        core.scheduler.update(out, core.runner.execute(out))
        if len(out.chunks) == running and out.num_tokens == running:
            return core
    raise RuntimeError("the requests never all decoded together (too little KV cache for --running?)")


def measure(core: EngineCore, steps: int, rounds: int) -> tuple[list[float], list[float], Clock]:
    """Alternating rounds of plain and instrumented steps: (plain step seconds, instrumented, the clock)."""
    clock = Clock()
    plain: list[float] = []
    timed: list[float] = []
    for _ in range(rounds):
        for _ in range(steps):
            began = time.perf_counter()
            core.step()
            plain.append(time.perf_counter() - began)
        with patched(instrumentation(core, clock)):
            for _ in range(steps):
                began = time.perf_counter()
                core.step()
                timed.append(time.perf_counter() - began)
    return plain, timed, clock


def report(plain: list[float], timed: list[float], clock: Clock, running: int) -> None:
    n = len(timed)
    per = {name: secs / n * 1e3 for name, secs in clock.kernel_s.items()}
    kernels_ms = sum(per.values())
    step_ms = sum(timed) / n * 1e3
    print(f"decode step, {running} running: plain {statistics.median(plain) * 1e3:.1f} ms median "
          f"({sum(plain) / len(plain) * 1e3:.1f} mean); instrumented {step_ms:.1f} ms mean")
    print(f"  kernels {kernels_ms:.2f} ms:", ", ".join(
        f"{name} {ms:.2f} ({clock.calls[name] // n}/step)" for name, ms in sorted(per.items(), key=lambda kv: -kv[1])))
    glue = {st: (clock.stage_s[st] - clock.kernel_in_stage_s[st]) / n * 1e3 for st in STAGES}
    glue["other"] = step_ms - kernels_ms - sum(glue.values())
    print(f"  glue {step_ms - kernels_ms:.2f} ms:", ", ".join(f"{st} {ms:.2f}" for st, ms in glue.items()))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pageserve bench step-overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--context", type=int, default=200, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=10, help="steps per round and mode")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--eager", action="store_true", help="steps through the Python layers (not the C++ ones)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, dtype=args.dtype, enforce_eager=args.eager)
    core = decoding_core(llm, args.running, args.context)
    freeze_startup_objects()  # as the engine process does before serving: no full collection walks the model
    layers = "C++ layers" if core.runner.fast_forward is not None else "Python layers"
    print(f"{args.model}, {core.dtype}, {torch.get_num_threads()} threads, {layers}")
    measure(core, 3, 1)  # warm-up: both modes once
    report(*measure(core, args.steps, args.rounds), args.running)
    return 0
