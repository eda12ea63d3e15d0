"""Must-show: the engine's LoRA steps through the Triton shrink/expand (interpreted) give the CPU path's tokens.

The GPU path is taken only for CUDA steps; here every step's LoraBatch also gets the kernels' layout on
the CPU (the interpreter runs CPU tensors), so the real layers hand the kernels their real x and out
(views, widths, dtypes) in mixed steps: prompt chunks and decodes, base rows and three adapters with
different ranks and targets. Float32 greedy tokens must be identical.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import engine.core
from engine.config import LoraConfig
from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from engine.worker import model_runner
from engine.worker.lora.adapter import load_adapter
from engine.worker.lora.batch import build_lora_batch
from engine.worker.lora.device_weights import GpuLoraStep, LoraSlots, plan_gpu_step
from shared.sampling import SamplingParams
from tests.support.lora_adapters import peft_adapter
from tests.support.tiny_model import tiny_llama_folder

ADAPTERS = {"all-r8": (8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
            "qv-r2": (2, ("q_proj", "v_proj")), "mlp-r4": (4, ("gate_proj", "up_proj", "down_proj"))}


def generate(folder: Path, modules: dict[str, Path], prompts: list[list[int]], loras: list[str]) -> list[list[int]]:
    # eager: the Python layers call LoraBatch.add (the C++ layer loop would take the C LoRA kernel instead)
    llm = LLM(str(folder), "float32", num_device_blocks=64, num_cpu_blocks=8, block_size=4, enforce_eager=True,
              scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=8),
              lora=LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, p in modules.items())))
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    return [r.token_ids for r in llm.generate(prompts, params, detokenize=False, lora=loras)]


def test_triton_lora_steps_match_the_cpu_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tiny_llama_folder(tmp_path / "tiny", num_layers=2)
    modules = {name: peft_adapter(folder, tmp_path / name, rank=r, alpha=2.0 * r, targets=t, seed=i)
               for i, (name, (r, t)) in enumerate(ADAPTERS.items())}
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (9, 3, 7, 5, 1, 6)]
    loras = ["all-r8", "", "qv-r2", "mlp-r4", "all-r8", "qv-r2"]
    expected = generate(folder, modules, prompts, loras)

    slots, groups_seen = LoraSlots(), []

    def with_kernels(row_counts, lora_ids, adapters, device, slots_arg=None):  # type: ignore[no-untyped-def]
        batch = build_lora_batch(row_counts, lora_ids, adapters, device)
        if batch is None:
            return None
        rows: dict[int, list[int]] = {}
        start = 0
        for n, lora_id in zip(row_counts, lora_ids, strict=True):
            if lora_id:
                rows.setdefault(lora_id, []).extend(range(start, start + n))
            start += n
        groups_seen.append(len(rows))
        return replace(batch, gpu=plan_gpu_step(rows, adapters, slots, torch.device("cpu")))

    calls = []
    real_add = GpuLoraStep.add
    monkeypatch.setattr(model_runner, "build_lora_batch", with_kernels)
    # the plain A and B, as on CUDA: on the CPU the engine keeps only the C kernel's packed form
    monkeypatch.setattr(engine.core, "load_adapter", functools.partial(load_adapter, packed=False))
    monkeypatch.setattr(GpuLoraStep, "add", lambda self, *a: (calls.append(a[3]), real_add(self, *a)))
    got = generate(folder, modules, prompts, loras)
    assert got == expected
    assert max(groups_seen) == 3 and {"qkv", "o", "gate_up", "down"} <= set(calls)  # the kernels ran, mixed
    assert slots.stacks < len(groups_seen)  # steps with an unchanged set of adapters reused their slots
