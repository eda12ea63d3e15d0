"""What a decode CUDA graph replays, run eagerly: padding rows never change the real rows or the cache.

engine/worker/decode_graphs.py pads a decode step to its bucket (slot -1, seq_len 1);
the model on those static buffers, through the Triton kernels (interpreted),
must give the unpadded step's hidden states and write no KV for padding rows.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import ModelConfig
from engine.worker.decode_graphs import StaticDecodeInputs
from engine.worker.input_batch import build_step_inputs, order_chunks
from engine.worker.kv_cache import CacheLayout, KVCache
from engine.worker.layers import linear
from engine.worker.layers.attention import KernelPagedAttention
from engine.worker.model_loader import load_model
from pageserve_kernels import cpu_gemm
from pageserve_kernels.choice import FORCE_ENV
from pageserve_kernels.dispatch import select_backend
from tests.engine.worker.test_decode_graphs import BLOCK_SIZE, decodes
from tests.support.tiny_model import tiny_llama_folder


def test_padded_forward_equals_the_unpadded_one(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One product for every row count: the per-bucket choice (pageserve_kernels/choice.py) may give 3 and
    # 8 rows different implementations, whose last bits differ by 1e-4 after two layers (a suite's picks
    # are timed under load). The panel GEMM computes each row alike whatever the batch.
    monkeypatch.setenv(FORCE_ENV, "linear=panel" if cpu_gemm.load() is not None else "linear=torch")
    monkeypatch.setattr(linear, "_PLANS", {})
    loaded = load_model(ModelConfig(model=str(tiny_llama_folder(tmp_path, num_layers=2)), dtype="float32"))
    s = loaded.shape
    layout = CacheLayout(BLOCK_SIZE, 32, 0, s.num_layers, s.num_kv_heads, s.head_dim, torch.float32)
    kv = KVCache(layout)
    gen = torch.Generator().manual_seed(0)
    for k, v in kv.layers:
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    attention = KernelPagedAttention(select_backend("triton", "cpu"))
    inputs = build_step_inputs(order_chunks(decodes([5, 9, 2])), BLOCK_SIZE, torch.device("cpu"), attention)
    with torch.inference_mode():
        before = kv.device_pool.clone()
        eager = loaded.model(inputs.input_ids, inputs.positions, kv.layers, inputs.meta, attention)
        after_eager = kv.device_pool.clone()
        kv.device_pool.copy_(before)
        static = StaticDecodeInputs.allocate(8, width=8, max_seq_len=32, device=torch.device("cpu"))
        static.meta.slot_mapping.fill_(7)  # stale slots of an earlier, larger step
        b = static.fill(inputs)
        padded = loaded.model(static.input_ids, static.positions, kv.layers, static.meta, attention)
    assert torch.allclose(padded[:b], eager, atol=1e-5, rtol=1e-5)
    # Padding rows wrote no KV: the pool equals the eager step's.
    assert torch.allclose(kv.device_pool, after_eager, atol=1e-5, rtol=1e-5)
