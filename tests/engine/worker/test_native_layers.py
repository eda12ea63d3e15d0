"""engine/worker/native_layers.py: steps through the C++ layer loop equal the Python layers' bit for bit.

Every step the C++ layers run is also run by the Python forward on the same inputs (both write
the same K/V to the same slots), and the hidden states must be equal: decode, prompt and mixed
steps, prompt chunks by the C prefill kernel or by PyTorch's SDPA called from C++. Steps with PyTorch
decode groups stay with Python. The tiny model's widths lose to PyTorch in fused_choice's and
prefill_choice's timing on some hosts, so the fused ops and prompt attention are forced to their C
kernels here (but where a test says otherwise), for both paths alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from engine.step_failures import RequestsFailed
from engine.worker.input_batch import StepInputs
from engine.worker.layers import linear as linear_mod
from engine.worker.native_layers import TIMED_KINDS, NativeLayers
from pageserve_kernels import choice, cpu_prefill, fused_choice, prefill_choice, torch_ops
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts
from tests.support.tiny_model import tiny_folder, tiny_llama_folder

pytestmark = pytest.mark.skipif(not torch_ops.load("llama_layers"), reason="no C++ compiler for torch operators")

LAYERS = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 32: the C decode kernel's wide variants apply, as for real models."""
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-hd32"), hidden_size=128, intermediate_size=256,
                             num_layers=LAYERS, num_heads=4, num_kv_heads=2)


@pytest.fixture(autouse=True)
def c_fused_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused_choice, "native_wins", lambda *args: True)
    monkeypatch.setattr(prefill_choice, "native_prompts_win", lambda *args: True)
    yield


def make(model_dir: Path, dtype: str, eager: bool = False) -> LLM:
    sched = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    return LLM(str(model_dir), dtype, num_device_blocks=96, block_size=4, scheduler=sched, enforce_eager=eager)


def compared_with_python(llm: LLM) -> list[int]:
    """Wraps the C++ layers so each step they run is run by the Python layers too; returns those steps' row counts."""
    native, runner = llm.core.runner.fast_forward, llm.core.runner
    assert isinstance(native, NativeLayers)
    fast_forward, rows = native.forward, []

    def both(inputs: StepInputs) -> torch.Tensor | None:
        fast = fast_forward(inputs)
        if fast is not None:
            slow = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta,
                                runner.attention)
            assert fast.dtype == slow.dtype == torch.float32
            assert torch.equal(fast, slow), (fast - slow).abs().max()
            rows.append(inputs.input_ids.shape[0])
        return fast

    native.forward = both  # type: ignore[method-assign]
    return rows


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params, detokenize=False)]  # type: ignore[arg-type]


def step_kinds(native: NativeLayers) -> list[tuple[bool, bool, bool, bool]]:
    """Spies on the C++ layers: (has decode rows, has prompt chunks, continues a cached prompt, ran natively)
    for every step."""
    seen: list[tuple[bool, bool, bool, bool]] = []
    inner = native.forward

    def spy(inputs: StepInputs) -> torch.Tensor | None:
        out = inner(inputs)
        plan = inputs.meta.plan
        assert plan is not None
        continued = any(c.context_len for c in plan.chunks)
        seen.append((plan.native_decode is not None, bool(plan.chunks), continued, out is not None))
        return out

    native.forward = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(("dtype", "products"), [("float32", "measured"), ("float32", "panel"), ("bfloat16", "measured"),
                                                 ("bfloat16", "panel"), ("bfloat16", "amx")])
def test_every_step_equals_the_python_layers(model_dir: Path, dtype: str, products: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if products != "measured":  # one of our GEMMs from C++, whatever the timing would pick for the tiny widths
        if products not in linear_mod.candidates(getattr(torch, dtype)):
            pytest.skip(f"no {dtype} {products} GEMM on this CPU")
        monkeypatch.setattr(linear_mod, "_PLANS", {})
        monkeypatch.setenv(choice.FORCE_ENV, f"linear={products}")
    llm = make(model_dir, dtype)
    rows = compared_with_python(llm)
    seen = step_kinds(llm.core.runner.fast_forward)  # type: ignore[arg-type]
    prompts = random_prompts([5, 17, 9, 30, 3, 50, 40], 512, seed=1)  # 154 prompt tokens: chunked, beside decodes
    tokens = generate(llm, prompts)
    assert rows and all(ran for *_, ran in seen)
    assert any(decodes and chunks for decodes, chunks, *_ in seen)  # mixed steps ran natively too
    eager = make(model_dir, dtype, eager=True)
    assert eager.core.runner.fast_forward is None
    assert generate(eager, prompts) == tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_qwen_layers_run_in_cpp_and_equal_the_python_layers(architecture: str, dtype: str,
                                                            tmp_path: Path) -> None:
    """Qwen2's q/k/v biases and Qwen3's per-head q/k norms: the two options the C++ loop implements."""
    folder = tiny_folder(architecture, tmp_path, hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, use_sliding_window=False)
    llm = make(folder, dtype)
    rows = compared_with_python(llm)
    seen = step_kinds(llm.core.runner.fast_forward)  # type: ignore[arg-type]
    tokens = generate(llm, random_prompts([5, 17, 9, 30, 3], 512, seed=2))
    assert rows and all(ran for *_, ran in seen)
    assert generate(make(folder, dtype, eager=True), random_prompts([5, 17, 9, 30, 3], 512, seed=2)) == tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("why", ["pytorch faster", "no prefill kernel"])
def test_prompts_left_to_pytorch_attention_run_in_cpp_too(model_dir: Path, dtype: str, why: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where PyTorch's SDPA beat the C prefill kernel (an AMX host) or the kernel is not built, prompt and mixed
    steps still skip the Python layers: C++ calls the SDPA the Python path would, to the same bits."""
    if why == "pytorch faster":
        monkeypatch.setattr(prefill_choice, "native_prompts_win", lambda *args: False)
    else:
        monkeypatch.setattr(cpu_prefill, "load", lambda: None)
    llm = make(model_dir, dtype)
    native = llm.core.runner.fast_forward
    assert isinstance(native, NativeLayers) and not native.prompts_in_c
    rows = compared_with_python(llm)
    seen = step_kinds(native)
    generate(llm, random_prompts([40, 6, 50, 9], 512), max_tokens=4)  # chunks continue prompts, share steps with decodes
    assert rows and all(ran for *_, ran in seen)
    assert any(decodes and chunks for decodes, chunks, *_ in seen) and any(continued for _, _, continued, _ in seen)


def test_timings_count_every_kernel_call(model_dir: Path) -> None:
    llm = make(model_dir, "bfloat16")
    native = llm.core.runner.fast_forward
    assert isinstance(native, NativeLayers)
    native.time_kernels()
    generate(llm, random_prompts([6], 512), max_tokens=3)  # a prompt step, then two decode steps
    times = native.kernel_times()
    per_layer = dict(zip(TIMED_KINDS, (2 * 3, 3, 3, 2, 3, 4 * 3, 1), strict=True))
    assert {k: calls for k, (_, calls) in times.items()} == {k: LAYERS * n for k, n in per_layer.items()}
    assert all(s > 0 for s, _ in times.values())


def test_a_slot_outside_the_cache_raises(model_dir: Path) -> None:
    llm = make(model_dir, "float32")
    native = llm.core.runner.fast_forward
    assert isinstance(native, NativeLayers)
    fast_forward = native.forward

    def bad_slot(inputs: StepInputs) -> torch.Tensor | None:
        plan = inputs.meta.plan
        if plan is not None and plan.native_decode is not None:
            inputs.meta.slot_mapping[0] = 10**9
        return fast_forward(inputs)

    native.forward = bad_slot  # type: ignore[method-assign]
    with pytest.raises(RequestsFailed, match="IndexError: 1 KV cache slots outside"):
        generate(llm, random_prompts([6], 512), max_tokens=3)


def test_off_where_an_op_would_not_run_its_c_kernel(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_choice, "native_wins", lambda op, *args: op != "silu_and_mul")
    assert make(model_dir, "float32").core.runner.fast_forward is None


def test_forced_off(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGESERVE_KERNEL_CHOICE", "llama_layers=python")
    assert make(model_dir, "float32").core.runner.fast_forward is None
    monkeypatch.setenv("PAGESERVE_KERNEL_CHOICE", "llama_layers=cpp")
    assert isinstance(make(model_dir, "float32").core.runner.fast_forward, NativeLayers)
    monkeypatch.setenv("PAGESERVE_KERNEL_CHOICE", "llama_layers=fast")
    with pytest.raises(ValueError, match="the choices are cpp and python"):
        make(model_dir, "float32")
