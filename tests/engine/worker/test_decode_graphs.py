"""engine/worker/decode_graphs.py on the CPU: buckets, padding, and that padding rows never change real rows.

The capture itself needs CUDA (ops/gpu_check.py compares graph and eager
tokens there); what a graph replays is the model run on the padded static
buffers: tests/kernels/test_decode_graph_padding.py runs that eagerly through
the Triton kernels in the interpreter.
"""

from __future__ import annotations

import torch

from engine.outputs import ScheduledChunk
from engine.worker.decode_graphs import DecodeGraphs, StaticDecodeInputs, bucket_sizes, pick_bucket
from engine.worker.input_batch import build_step_inputs, order_chunks
from engine.worker.layers.attention import KernelPagedAttention
from shared.sampling import SamplingParams

BLOCK_SIZE = 4


def test_buckets_are_vllms_and_cover_the_seat_count() -> None:
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert bucket_sizes(3) == [1, 2, 4]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 24]
    sizes = bucket_sizes(64)
    assert [pick_bucket(b, sizes) for b in (1, 3, 5, 8, 9, 63, 64, 65)] == [1, 4, 8, 8, 16, 64, 64, None]


def decodes(contexts: list[int]) -> list[ScheduledChunk]:
    greedy = SamplingParams(temperature=0.0)
    return [
        ScheduledChunk(f"r{i}", [10 + i], ctx, list(range(3 * i, 3 * i + -(-(ctx + 1) // BLOCK_SIZE))), True,
                       greedy, 1)
        for i, ctx in enumerate(contexts)
    ]


def test_fill_copies_real_rows_and_pads_the_rest() -> None:
    static = StaticDecodeInputs.allocate(8, width=6, max_seq_len=24, device=torch.device("cpu"))
    static.meta.slot_mapping.fill_(99)  # stale values from an earlier, larger step
    static.meta.seq_lens.fill_(99)
    inputs = build_step_inputs(order_chunks(decodes([5, 9, 2])), BLOCK_SIZE, torch.device("cpu"), KernelPagedAttention(backend=None))
    assert static.fill(inputs) == 3
    assert static.input_ids.tolist() == inputs.input_ids.tolist() + [0] * 5
    assert static.positions.tolist() == inputs.positions.tolist() + [0] * 5
    assert static.meta.slot_mapping.tolist() == inputs.meta.slot_mapping.tolist() + [-1] * 5
    assert static.meta.seq_lens.tolist() == inputs.meta.seq_lens.tolist() + [1] * 5
    assert static.meta.query_start_loc.tolist() == list(range(9))
    assert torch.equal(static.meta.block_tables[:3, :3], inputs.meta.block_tables)


def test_no_graph_means_eager() -> None:
    inputs = build_step_inputs(order_chunks(decodes([5])), BLOCK_SIZE, torch.device("cpu"), KernelPagedAttention(backend=None))
    assert DecodeGraphs(None, [], None).forward(inputs) is None  # type: ignore[arg-type]
