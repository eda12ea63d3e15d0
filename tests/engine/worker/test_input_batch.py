"""engine/worker/input_batch.py: one step's flat inputs, with the attention op planning its own metadata."""

from __future__ import annotations

import torch

from engine.outputs import ScheduledChunk
from engine.worker.input_batch import build_step_inputs, order_chunks
from engine.worker.layers.attention import KernelPagedAttention, TorchPagedAttention
from shared.sampling import SamplingParams


def chunk(rid: str, tokens: list[int], start: int, blocks: list[int]) -> ScheduledChunk:
    return ScheduledChunk(rid, tokens, start, blocks, True, SamplingParams(), 0, None)


CHUNKS = order_chunks([chunk("p", [5, 6, 7], 0, [3]), chunk("d", [9], 6, [1, 2])])


def test_the_torch_backend_plans_its_step_and_the_kernel_backend_does_not() -> None:
    cpu = torch.device("cpu")
    planned = build_step_inputs(CHUNKS, 4, cpu, TorchPagedAttention(native_decode=True))
    assert planned.meta.plan is not None and planned.meta.plan.native_decode is not None
    assert build_step_inputs(CHUNKS, 4, cpu, TorchPagedAttention()).meta.plan.native_decode is None
    bare = build_step_inputs(CHUNKS, 4, cpu, KernelPagedAttention(backend=None))
    assert bare.meta.plan is None
    # rows: the decode first (slot 2*4 + 6%4), then the prompt's three tokens in block 3
    assert planned.meta.slot_mapping.tolist() == bare.meta.slot_mapping.tolist() == [10, 12, 13, 14]
    assert planned.input_ids.tolist() == [9, 5, 6, 7] and planned.logits_indices.tolist() == [0, 3]
