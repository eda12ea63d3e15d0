"""Where an engine step's time goes: matmuls, attention, elementwise ops, sampling, Python.

`pageserve bench offline --profile` runs the workload once more under cProfile,
one profile per step, and sums each function's own time (cProfile's tottime)
into a few categories. The C kernels are called through ctypes, which cProfile
does not list apart, so their time lands in the Python wrapper that calls them
(`pageserve_kernels/cpu_decode.py`, `pageserve_kernels/cpu_fused.py`): the rules below match those
wrappers by file. A step run by the C++ layer loop (engine/worker/native_layers.py) is one
call to cProfile; the loop times its own kernels (`NATIVE_KINDS` says where each goes), and that
time is moved out of the call into its categories. Steps are split into decode-only steps (every request in the
step adds one token) and steps that carry prompt tokens, because the two have
very different shapes. The profiler itself adds a little to the Python share.
"""

from __future__ import annotations

import cProfile
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType

from engine.core import EngineCore
from engine.request import Request
from engine.worker.native_layers import TIMED_KINDS, NativeLayers
from shared.sampling import SamplingParams

# torch's products as cProfile names them, e.g. "<built-in method torch._C._nn.linear>"
MATMUL_OPS = re.compile(r"\b(linear|_linear_pointwise|_mkl_linear|addmm|matmul|mm|bmm)\b")

# (category, rule on (file, function name)); the first rule that matches wins. cProfile names
# builtins by a string, not a code object: those get file "~".
Rule = Callable[[str, str], bool]
CATEGORIES: list[tuple[str, Rule]] = [
    ("matmul", lambda f, n: f == "~" and MATMUL_OPS.search(n) is not None or f.endswith("pageserve_kernels/cpu_gemm.py")),
    ("attention: decode", lambda f, n: f.endswith("pageserve_kernels/cpu_decode.py") or "paged_attention" in n),
    # index_select gathers a prompt chunk's earlier context out of the paged cache
    ("attention: prompts", lambda f, n: f == "~" and ("scaled_dot_product" in n or "index_select" in n)
     or f.endswith("pageserve_kernels/cpu_prefill.py")),
    ("KV cache writes", lambda f, n: f == "~" and "index_copy" in n or n == "store_kv"),
    ("sampling", lambda f, n: f.endswith(("engine/worker/sampler.py", "engine/scheduling/sample_group.py")) or n in ("argmax", "exact_logits")),
    ("norms, SiLU, rotary", lambda f, n: f.endswith(("pageserve_kernels/cpu_fused.py", "pageserve_kernels/cpu_fused_bf16.py",
                                                    "pageserve_kernels/fused_ops.py"))),
    ("scheduler", lambda f, n: "engine/scheduling/" in f or f.endswith("engine/request.py")),
]
OTHER = "other Python and torch glue"
NATIVE_KINDS = dict(zip(TIMED_KINDS, ("norms, SiLU, rotary", "norms, SiLU, rotary", "KV cache writes",
                                       "attention: decode", "norms, SiLU, rotary", "matmul", "attention: prompts"),
                         strict=True))


@dataclass
class StepKind:
    steps: int = 0
    seconds: float = 0.0
    by_category: dict[str, float] = field(default_factory=dict)

    def add(self, seconds: float, by_category: dict[str, float]) -> None:
        self.steps += 1
        self.seconds += seconds
        for name, secs in by_category.items():
            self.by_category[name] = self.by_category.get(name, 0.0) + secs


@dataclass
class StepProfile:
    decode: StepKind = field(default_factory=StepKind)
    """Steps where every scheduled request adds exactly one token."""
    prompt: StepKind = field(default_factory=StepKind)
    """Steps that carry prompt tokens (prefill chunks, usually beside decodes)."""
    matmul_flops: float = 0.0
    """The model's matmul FLOPs over the run (body for every token, vocab product per sampled row)."""

    @property
    def seconds(self) -> float:
        return self.decode.seconds + self.prompt.seconds

    def category(self, name: str) -> float:
        return self.decode.by_category.get(name, 0.0) + self.prompt.by_category.get(name, 0.0)


def categorize(code: CodeType | str) -> str:
    file, name = ("~", code) if isinstance(code, str) else (code.co_filename, code.co_name)
    return next((cat for cat, rule in CATEGORIES if rule(file, name)), OTHER)


def profile_steps(core: EngineCore, prompts: list[list[int]], output_lens: list[int]) -> StepProfile:
    """Run the requests to completion (greedy, EOS ignored), one cProfile per step."""
    for i, (prompt, n_out) in enumerate(zip(prompts, output_lens, strict=True)):
        params = SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        core.add_request(Request(f"profile-{i}", prompt, params, arrival_time=0.0))
    shape = core.runner.model.shape
    body_flops, vocab_flops = shape.flops_per_token(), 2 * shape.hidden_size * shape.vocab_size
    names: dict[CodeType | str, str] = {}
    result = StepProfile()
    native = core.runner.fast_forward if isinstance(core.runner.fast_forward, NativeLayers) else None
    while core.has_unfinished():
        if native is not None:
            native.time_kernels()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        out = core.scheduler.schedule()  # EngineCore.step, with the schedule kept to tell the step's kind
        deltas = core.scheduler.update(out, core.runner.execute(out))
        prof.disable()
        seconds = time.perf_counter() - t0
        by_category: dict[str, float] = {}
        for entry in prof.getstats():
            cat = names.get(entry.code) or names.setdefault(entry.code, categorize(entry.code))
            by_category[cat] = by_category.get(cat, 0.0) + entry.inlinetime
        if native is not None:
            for kind, (secs, _) in native.kernel_times().items():
                by_category[NATIVE_KINDS[kind]] = by_category.get(NATIVE_KINDS[kind], 0.0) + secs
                by_category[OTHER] = by_category.get(OTHER, 0.0) - secs  # the op call's own time held them
        by_category[OTHER] = by_category.get(OTHER, 0.0) + seconds - sum(by_category.values())  # unprofiled edges
        kind = result.decode if out.num_tokens == len(out.chunks) else result.prompt
        kind.add(seconds, by_category)
        sampled = sum(len(d.new_token_ids) for d in deltas)
        result.matmul_flops += out.num_tokens * body_flops + sampled * vocab_flops
    return result


def format_profile(p: StepProfile) -> str:
    cats = [c for c, _ in CATEGORIES] + [OTHER]
    head = f"{'':<28}{'whole run':>16}{'decode step':>14}{'prompt step':>14}"
    sub = f"{'':<28}{'s':>9}{'%':>7}{'ms':>14}{'ms':>14}"
    lines = [f"step profile (cProfile; {p.decode.steps} decode-only steps, {p.prompt.steps} steps with prompt tokens)",
             head, sub]

    def per_step(kind: StepKind, cat: str | None) -> float:
        secs = kind.seconds if cat is None else kind.by_category.get(cat, 0.0)
        return 1e3 * secs / kind.steps if kind.steps else 0.0

    for cat in cats:
        secs = p.category(cat)
        lines.append(f"{cat:<28}{secs:>9.2f}{100 * secs / p.seconds:>7.1f}"
                     f"{per_step(p.decode, cat):>14.1f}{per_step(p.prompt, cat):>14.1f}")
    lines.append(f"{'total':<28}{p.seconds:>9.2f}{100.0:>7.1f}{per_step(p.decode, None):>14.1f}"
                 f"{per_step(p.prompt, None):>14.1f}")
    matmul = p.category("matmul")
    if matmul > 0:
        lines.append(f"matmuls: {p.matmul_flops / 1e12:.2f} TFLOP of model products in {matmul:.1f} s = "
                     f"{p.matmul_flops / matmul / 1e9:.0f} GFLOP/s")
    return "\n".join(lines)
