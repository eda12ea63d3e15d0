"""Must-show: the whole engine runs through the Triton kernels (interpreted) and matches the torch path.

A tiny random Llama, a continuous batch with chunked prefill (a small token
budget splits the long prompt across steps, next to decodes) and a prefix-cache
hit (two prompts share two full blocks): greedy tokens must be identical.
"""

from __future__ import annotations

import logging

import torch

from engine.llm import LLM, GenerationResult
from engine.scheduling.config import SchedulerConfig
from engine.worker.layers.attention import KernelPagedAttention
from pageserve_kernels.copy_blocks import copy_blocks
from shared.sampling import SamplingParams
from tests.support.tiny_model import tiny_llama_folder


def generate(folder: str, backend: str, prompts: list[list[int]]) -> tuple[list[GenerationResult], LLM]:
    llm = LLM(
        model=folder,
        dtype="float32",
        block_size=16,
        num_device_blocks=64,
        num_cpu_blocks=8,
        scheduler=SchedulerConfig(max_num_batched_tokens=24, max_model_len=256),
        attention_backend=backend,
    )
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    return llm.generate(prompts, params, detokenize=False), llm


def test_triton_engine_matches_torch_engine(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pageserve.engine")
    folder = str(
        tiny_llama_folder(tmp_path / "tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1)
    )
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 512, (32,), generator=gen).tolist()
    prompts = [
        torch.randint(3, 512, (5,), generator=gen).tolist(),
        shared + torch.randint(3, 512, (9,), generator=gen).tolist(),  # 41 tokens: chunked by the budget
        shared + [7],  # prefix-cache hit on two full blocks
    ]
    expected, _ = generate(folder, "torch", prompts)
    got, llm = generate(folder, "triton", prompts)
    attention = llm.core.runner.attention
    assert isinstance(attention, KernelPagedAttention) and attention.backend.name == "triton"
    assert llm.core.kv_cache.mover._copy_blocks is copy_blocks  # copy-on-write runs the Triton kernel
    assert len(llm.core.kernel_variants) == 5  # the start-up warm-up compiled every attention variant
    assert "triton warm-up: 5 paged-attention variants" in caplog.text  # and printed them at start
    assert all(v.describe() in caplog.text for v in llm.core.kernel_variants)
    assert got[2].num_cached_tokens >= 16  # the prefix-cache hit really happened
    assert all(len(r.token_ids) == 5 for r in got)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
