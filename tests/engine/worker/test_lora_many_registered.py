"""100 registered adapters cost nothing while a few run: past --max-cpu-loras a registered load holds no
tensor (its name, path and stamp only, from start-up on), and a step's work never walks the registry
(counted: reads and iterations of the registry's per-name tables, not timed). Adapters are written
with safetensors directly (rank 2 on q_proj of the tiny Llama): milliseconds each.
"""

from __future__ import annotations

import gc
import json
import time
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import engine.core
from engine.config import LoraConfig
from engine.llm import LLM
from engine.request import Request
from engine.worker.lora.adapter import LoraAdapter
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts, tiny_model

__all__ = ["tiny_model"]

NUM_REGISTERED, MAX_CPU_LORAS = 100, 2
KEY = "base_model.model.model.layers.{}.self_attn.q_proj.lora_{}.weight"


def q_adapter(folder: Path, seed: int) -> Path:
    """Rank 2 on every layer's q_proj of the tiny Llama (hidden 64, q width 64)."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir()
    save_file({KEY.format(layer, ab): torch.randn(shape, generator=g) * 0.2 for layer in range(3)
               for ab, shape in (("A", (2, 64)), ("B", (64, 2)))}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                            "target_modules": ["q_proj"]}))
    return folder


class CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts walks over it (a per-step loop over every registered adapter would show here)."""

    walks = 0

    def __iter__(self) -> Any:
        CountingDict.walks += 1
        return super().__iter__()

    def keys(self) -> Any:
        CountingDict.walks += 1
        return super().keys()

    def values(self) -> Any:
        CountingDict.walks += 1
        return super().values()

    def items(self) -> Any:
        CountingDict.walks += 1
        return super().items()


def test_a_hundred_registered_adapters_hold_no_tensors_and_no_step_walks_them(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modules = tuple((f"t{i}", str(q_adapter(tmp_path / f"t{i}", i))) for i in range(NUM_REGISTERED))
    refs: list[weakref.ref[LoraAdapter]] = []  # (a frozen dataclass of dicts: not hashable, no WeakSet)

    def alive() -> int:
        return sum(ref() is not None for ref in refs)
    reads: list[str] = []
    most_alive = 0
    real_load = engine.core.load_adapter

    def counting_load(path: Any, name: str, *args: Any, **kwargs: Any) -> LoraAdapter:
        nonlocal most_alive
        reads.append(name)
        adapter = real_load(path, name, *args, **kwargs)
        refs.append(weakref.ref(adapter))
        most_alive = max(most_alive, alive())
        return adapter
    monkeypatch.setattr(engine.core, "load_adapter", counting_load)
    config = LoraConfig(enabled=True, modules=modules, max_loras=2, max_cpu_loras=MAX_CPU_LORAS)
    llm = LLM(str(tiny_model), "float32", num_device_blocks=96, num_cpu_blocks=32, block_size=4, lora=config)
    core, registry = llm.core, llm.core.loras
    assert registry is not None and len(reads) == NUM_REGISTERED  # each checked once at start-up
    assert most_alive <= MAX_CPU_LORAS + 1, "start-up held every registered adapter's tensors at once"
    assert registry.num_resident == MAX_CPU_LORAS
    registry._names, registry._stamps = CountingDict(registry._names), CountingDict(registry._stamps)
    CountingDict.walks = 0
    reads.clear()
    tokens: dict[str, list[int]] = defaultdict(list)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    rounds = ["t0", "t50", "t99", "t0", "t99"]  # t98, t99 resident after start-up (the last loaded)
    for i, name in enumerate(rounds):
        for j in range(2):
            core.add_request(Request(f"{name}-{i}-{j}", random_prompts([7], 512, seed=i)[0], params,
                                     arrival_time=0.0, lora_name=name))
        core.add_request(Request(f"base-{i}", random_prompts([5], 512, seed=i)[0], params, arrival_time=0.0))
        deadline = time.monotonic() + 60  # each round to its end: an evicted adapter's read may take a while
        while core.has_unfinished() and time.monotonic() < deadline:
            if core.waits_only_on_reads():
                time.sleep(0.001)  # a step now would only spin: the reader thread has the folder
            for d in core.step():
                tokens[d.request_id] += d.new_token_ids
            core.counts()  # a Stats answer per step: its LoRA figures must not walk the registry either
        gc.collect()
        assert alive() <= MAX_CPU_LORAS and registry.num_resident <= MAX_CPU_LORAS
    assert not core.has_unfinished() and all(len(t) == 4 for t in tokens.values())
    assert CountingDict.walks == 0, "a step or a Stats answer walked every registered adapter"
    assert reads == ["t0", "t50", "t99", "t0"]  # evicted ones a request named, once each; the last t99 resident
