"""Device-correctness without a GPU: step inputs and a whole runner step on PyTorch's `meta` device.

A meta tensor has a shape and a device but no data, and PyTorch refuses to mix
it with CPU tensors in an operation, exactly as it refuses to mix CUDA and CPU
tensors. So a tensor the engine creates on the CPU by mistake fails here, on a
machine without a GPU, where a CPU-only suite would never notice. The attention
kernels and the sampler cannot run without data: the runner step below uses a
backend and a sampler that only check devices and shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig
from engine.llm import LLM
from engine.outputs import ScheduledChunk, SchedulerOutput
from engine.worker.input_batch import build_step_inputs, order_chunks
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.layers.attention import KernelPagedAttention
from engine.worker.model_loader import load_model
from engine.worker.model_runner import ModelRunner
from engine.worker.sampler import SamplerOutput
from pageserve_kernels.dispatch import AttentionBackend, copy_blocks_torch
from shared.sampling import SamplingParams
from tests.support.tiny_model import tiny_llama_folder

META = torch.device("meta")
BLOCK_SIZE = 4


def chunks() -> list[ScheduledChunk]:
    greedy = SamplingParams(temperature=0.0)
    return [
        ScheduledChunk("prefill", list(range(3, 12)), 0, [4, 5, 6], True, greedy, 0),
        ScheduledChunk("decode-long", [7], 10, [0, 1, 2], True, greedy, 3),
        ScheduledChunk("partial", [8, 9, 10], 2, [3, 7], False, greedy, 0),
        ScheduledChunk("decode-short", [5], 2, [8], True, greedy, 1),
    ]


def tensors_of(obj: object) -> dict[str, torch.Tensor]:
    return {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}


def test_step_inputs_are_built_on_the_device() -> None:
    inputs = build_step_inputs(order_chunks(chunks()), BLOCK_SIZE, META, KernelPagedAttention(backend=None))
    found = {**tensors_of(inputs), **tensors_of(inputs.meta)}
    assert set(found) == {"input_ids", "positions", "logits_indices", "slot_mapping", "query_start_loc",
                          "seq_lens", "block_tables"}
    assert {name: t.device.type for name, t in found.items()} == dict.fromkeys(found, "meta")


def check_same_device(*tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    assert devices == {META}, f"tensors on {devices}"


def meta_paged_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, window=0,
                         softcap=0.0, *, max_query_len=None, max_seq_len=None):  # type: ignore[no-untyped-def]
    check_same_device(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens)
    return torch.empty_like(query)


def meta_write_kv(key, value, key_cache, value_cache, slot_mapping) -> None:  # type: ignore[no-untyped-def]
    check_same_device(key, value, key_cache, value_cache, slot_mapping)


def meta_copy_blocks(caches: list[torch.Tensor], src_dst: torch.Tensor) -> None:
    check_same_device(*caches, src_dst)
    copy_blocks_torch(caches, src_dst)


class MetaSampler:
    """Checks what the runner hands the sampler (engineer 'sampling' owns the sampler's own meta tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.device, tuple[int, ...]]] = []

    def forget(self, request_ids: object) -> None:
        pass

    def sample_with_logprobs(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> SamplerOutput:
        self.calls.append((logits.device, tuple(logits.shape)))
        return SamplerOutput([0] * len(rows), {})


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny"), num_layers=2)


def test_a_runner_step_stays_on_the_device(tiny_folder: Path) -> None:
    loaded = load_model(ModelConfig(model=str(tiny_folder), device="meta", dtype="float32"))
    assert {p.device for p in loaded.model.parameters()} == {META}
    s = loaded.shape
    layout = CacheLayout(BLOCK_SIZE, 16, 4, s.num_layers, s.num_kv_heads, s.head_dim, torch.float32)
    kv_cache = KVCache(layout, "meta", meta_copy_blocks)
    backend = AttentionBackend("triton", meta_paged_attention, meta_write_kv, meta_copy_blocks)
    sampler = MetaSampler()
    runner = ModelRunner(loaded.model, kv_cache, sampler, backend)  # type: ignore[arg-type]
    result = runner.execute(SchedulerOutput(chunks(), blocks_to_copy=[(2, 9)]))
    assert sampler.calls == [(META, (3, s.vocab_size))]
    assert set(result.sampled_token_ids) == {"prefill", "decode-long", "decode-short"}


def test_llm_places_weights_and_cache_on_its_device(tiny_folder: Path) -> None:
    llm = LLM(model=str(tiny_folder), device="meta", num_device_blocks=8, num_cpu_blocks=2)
    assert {p.device for p in llm.core.runner.model.parameters()} == {META}
    assert llm.core.kv_cache.device_pool.device == META and llm.core.kv_cache.cpu_pool.device.type == "cpu"
