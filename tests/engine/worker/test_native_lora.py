"""Steps with LoRA adapter rows stay on the C++ layer loop (engine/worker/native_layers.py): every such step
runs there, and its hidden states equal the Python forward's bit for bit (both add the adapters' terms by
pageserve_kernels/cpu_lora.py's kernel) and the Python forward with PyTorch's LoRA products
(engine/worker/lora/batch.py's reference) within the dtype's rounding. Decode, prompt and mixed steps,
base rows beside three adapters of different ranks and targets, rows of one adapter scattered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.config import LoraConfig
from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from engine.worker.input_batch import StepInputs
from engine.worker.lora.adapter import LoraAdapter, load_adapter
from engine.worker.lora.batch import LoraBatch, LoraGroup
from engine.worker.native_layers import NativeLayers
from pageserve_kernels import cpu_lora, fused_choice, prefill_choice, torch_ops
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts
from tests.support.lora_adapters import peft_adapter
from tests.support.tiny_model import tiny_llama_folder

pytestmark = pytest.mark.skipif(not torch_ops.load("llama_layers"), reason="no C++ compiler for torch operators")

ADAPTERS = {  # name -> (rank, targets)
    "all-r16": (16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    "qv-r1": (1, ("q_proj", "v_proj")),
    "mlp-r8": (8, ("o_proj", "gate_proj", "up_proj", "down_proj")),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-hd32"), hidden_size=128, intermediate_size=256,
                             num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("loras")
    return {name: str(peft_adapter(model_dir, root / name, rank=rank, alpha=2.0 * rank, targets=targets, seed=i,
                                   std=0.05))
            for i, (name, (rank, targets)) in enumerate(ADAPTERS.items())}


@pytest.fixture(autouse=True)
def c_fused_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tiny widths may lose to PyTorch in the fused ops' timing here: the C++ loop needs the C ones."""
    monkeypatch.setattr(fused_choice, "native_wins", lambda *args: True)
    monkeypatch.setattr(prefill_choice, "native_prompts_win", lambda *args: True)
    yield


def make(model_dir: Path, dtype: str, adapters: dict[str, str], eager: bool = False) -> LLM:
    sched = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=8)
    lora = LoraConfig(enabled=True, modules=tuple(adapters.items()), max_loras=3)
    return LLM(str(model_dir), dtype, num_device_blocks=96, block_size=4, scheduler=sched, enforce_eager=eager,
               lora=lora)


def compared_with_python(llm: LLM, dtype: torch.dtype) -> list[tuple[bool, bool]]:
    """Wraps the C++ layers: each adapter step they run is run by the Python layers too, with the LoRA kernel
    (equal bit for bit) and with PyTorch's LoRA products (close). Returns (had adapter rows, ran in C++) per step."""
    native, runner = llm.core.runner.fast_forward, llm.core.runner
    assert isinstance(native, NativeLayers)
    inner, seen = native.forward, []

    def python(inputs: StepInputs, lora: LoraBatch) -> torch.Tensor:
        return runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta,  # type: ignore[no-any-return]
                            runner.attention, lora)

    def both(inputs: StepInputs, lora: LoraBatch | None = None) -> torch.Tensor | None:
        fast = inner(inputs, lora)
        seen.append((lora is not None, fast is not None))
        if fast is not None and lora is not None:
            assert lora.kernel is not None
            reference = python(inputs, LoraBatch(plain_groups(lora.groups)))  # PyTorch's LoRA products
            scale = reference.abs().max()  # the sums' order differs: relative to the hidden states' size
            assert (fast - reference).abs().max() <= (1e-5 if dtype == torch.float32 else 2**-5) * scale
            slow = python(inputs, lora)  # last: the KV cache keeps the kernel path's values
            assert torch.equal(fast, slow), (fast - slow).abs().max()
        return fast

    def plain_groups(groups: tuple[LoraGroup, ...]) -> tuple[LoraGroup, ...]:
        """The groups' adapters read again in the plain layout: packed adapters keep no plain tensors."""
        return tuple(replace(g, adapter=plain(g.adapter)) for g in groups)

    plains: dict[int, LoraAdapter] = {}

    def plain(adapter: LoraAdapter) -> LoraAdapter:
        if adapter.load_id not in plains:
            plains[adapter.load_id] = load_adapter(adapter.path, adapter.name, runner.model.shape, max_rank=64,
                                                   dtype=dtype, device="cpu", load_id=adapter.load_id, packed=False)
        return plains[adapter.load_id]

    native.forward = both  # type: ignore[method-assign]
    return seen


def generate(llm: LLM, prompts: list[list[int]], loras: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return [r.token_ids for r in llm.generate(prompts, params, detokenize=False, lora=loras)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adapter_steps_run_in_cpp_and_equal_the_python_layers(model_dir: Path, adapters: dict[str, str],
                                                               dtype: str) -> None:
    if cpu_lora.load(getattr(torch, dtype)) is None:
        pytest.skip(f"no {dtype} LoRA kernel on this host: adapter steps run the Python layers")
    llm = make(model_dir, dtype, adapters)
    seen = compared_with_python(llm, getattr(torch, dtype))
    prompts = random_prompts([5, 17, 9, 30, 3, 40, 12, 7], 512, seed=1)  # chunked prompts beside decodes
    loras = ["all-r16", "", "qv-r1", "all-r16", "mlp-r8", "", "qv-r1", "all-r16"]  # one adapter's rows scattered
    tokens = generate(llm, prompts, loras)
    assert any(had for had, _ in seen) and all(ran for _, ran in seen), seen
    eager = make(model_dir, dtype, adapters, eager=True)
    assert eager.core.runner.fast_forward is None
    assert generate(eager, prompts, loras) == tokens


def test_without_the_lora_kernel_adapter_steps_fall_back_to_python(model_dir: Path, adapters: dict[str, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No LoRA kernel (an older CPU, no compiler): adapters get no table, their steps run the Python layers with
    PyTorch's products, steps of base rows alone stay in C++."""
    monkeypatch.setattr(cpu_lora, "load", lambda dtype: None)
    llm = make(model_dir, "float32", adapters)
    native = llm.core.runner.fast_forward
    assert isinstance(native, NativeLayers) and native.kernels[9] == 0
    inner, seen = native.forward, []

    def spy(inputs: StepInputs, lora: LoraBatch | None = None) -> torch.Tensor | None:
        out = inner(inputs, lora)
        seen.append((lora is not None, out is not None))
        return out

    native.forward = spy  # type: ignore[method-assign]
    prompts = random_prompts([5, 9], 512, seed=2)
    generate(llm, prompts, ["all-r16", "all-r16"])
    generate(llm, prompts, ["", ""])
    assert (True, False) in seen and (False, True) in seen and (True, True) not in seen
