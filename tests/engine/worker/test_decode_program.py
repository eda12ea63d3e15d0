"""engine/worker/decode_program.py: decode steps through the C++ layer loop equal the Python layers' bit for bit.

Every decode step the program runs is also run by the Python forward on the same inputs (both write
the same K/V to the same slots), and the hidden states must be equal; prompt and mixed steps
stay with Python. The tiny model's widths lose to PyTorch in fused_choice's timing on some hosts,
so the fused ops are forced to their C kernels here, for both paths alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from engine.step_failures import RequestsFailed
from engine.worker.decode_program import TIMED_KINDS, DecodeProgram
from engine.worker.input_batch import StepInputs
from pageserve_kernels import fused_choice, torch_ops
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts
from tests.support.tiny_model import tiny_llama_folder

pytestmark = pytest.mark.skipif(not torch_ops.load("decode_layers"), reason="no C++ compiler for torch operators")

LAYERS = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 32: the C decode kernel's wide variants apply, as for real models."""
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-hd32"), hidden_size=128, intermediate_size=256,
                             num_layers=LAYERS, num_heads=4, num_kv_heads=2)


@pytest.fixture(autouse=True)
def c_fused_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused_choice, "native_wins", lambda *args: True)
    yield


def make(model_dir: Path, dtype: str, eager: bool = False) -> LLM:
    sched = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    return LLM(str(model_dir), dtype, num_device_blocks=96, block_size=4, scheduler=sched, enforce_eager=eager)


def compared_with_python(llm: LLM) -> list[int]:
    """Wraps the program so each step it runs is run by the Python layers too; returns those steps' row counts."""
    program, runner = llm.core.runner.fast_decode, llm.core.runner
    assert isinstance(program, DecodeProgram)
    fast_forward, rows = program.forward, []

    def both(inputs: StepInputs) -> torch.Tensor | None:
        fast = fast_forward(inputs)
        if fast is not None:
            slow = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta,
                                runner.attention)
            assert fast.dtype == slow.dtype == torch.float32
            assert torch.equal(fast, slow), (fast - slow).abs().max()
            rows.append(inputs.input_ids.shape[0])
        return fast

    program.forward = both  # type: ignore[method-assign]
    return rows


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params, detokenize=False)]  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_steps_equal_the_python_layers(model_dir: Path, dtype: str) -> None:
    llm = make(model_dir, dtype)
    rows = compared_with_python(llm)
    prompts = random_prompts([5, 17, 9, 30, 3], 512, seed=1)
    tokens = generate(llm, prompts)
    assert rows and max(rows) == 5  # decode steps of every request ran through the program
    eager = make(model_dir, dtype, eager=True)
    assert eager.core.runner.fast_decode is None
    assert generate(eager, prompts) == tokens


def test_prompt_and_mixed_steps_stay_in_python(model_dir: Path) -> None:
    llm = make(model_dir, "float32")
    program = llm.core.runner.fast_decode
    assert isinstance(program, DecodeProgram)
    seen: list[tuple[int, bool, bool]] = []  # (longest query, has decode rows, the program ran)
    fast_forward = program.forward

    def spy(inputs: StepInputs) -> torch.Tensor | None:
        out = fast_forward(inputs)
        plan = inputs.meta.plan
        seen.append((inputs.meta.max_query_len, plan is not None and plan.native_decode is not None, out is not None))
        return out

    program.forward = spy  # type: ignore[method-assign]
    generate(llm, random_prompts([40, 6, 50], 512), max_tokens=4)  # the third prompt's chunks share steps with decodes
    assert all(ran == (query_len == 1) for query_len, _, ran in seen)
    assert any(query_len > 1 and decodes for query_len, decodes, _ in seen)  # a mixed step ran in Python
    assert any(ran for *_, ran in seen)


def test_timings_count_every_kernel_call(model_dir: Path) -> None:
    llm = make(model_dir, "bfloat16")
    program = llm.core.runner.fast_decode
    assert isinstance(program, DecodeProgram)
    program.timings = torch.zeros(2, len(TIMED_KINDS), dtype=torch.float64)
    generate(llm, random_prompts([6], 512), max_tokens=3)  # two decode steps
    seconds, calls = program.timings.tolist()
    per_layer = dict(zip(TIMED_KINDS, (2, 1, 1, 1, 1, 4), strict=True))
    assert dict(zip(TIMED_KINDS, calls, strict=True)) == {k: 2 * LAYERS * n for k, n in per_layer.items()}
    assert all(s > 0 for s in seconds)


def test_a_slot_outside_the_cache_raises(model_dir: Path) -> None:
    llm = make(model_dir, "float32")
    program = llm.core.runner.fast_decode
    assert isinstance(program, DecodeProgram)
    fast_forward = program.forward

    def bad_slot(inputs: StepInputs) -> torch.Tensor | None:
        plan = inputs.meta.plan
        if plan is not None and plan.native_decode is not None and not plan.chunks:
            inputs.meta.slot_mapping[0] = 10**9
        return fast_forward(inputs)

    program.forward = bad_slot  # type: ignore[method-assign]
    with pytest.raises(RequestsFailed, match="IndexError: 1 KV cache slots outside"):
        generate(llm, random_prompts([6], 512), max_tokens=3)


def test_off_where_an_op_would_not_run_its_c_kernel(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_choice, "native_wins", lambda op, *args: op != "silu_and_mul")
    assert make(model_dir, "float32").core.runner.fast_decode is None


def test_forced_off(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGESERVE_KERNEL_CHOICE", "decode_layers=python")
    assert make(model_dir, "float32").core.runner.fast_decode is None
