"""The compiled kernels on a CUDA device (run: TRITON_INTERPRET=0 pytest tests/kernels -m gpu)."""

from __future__ import annotations

import pytest
import torch

from pageserve_kernels.checks import interpreting
from tests.kernels.factories import assert_close_to_reference, make_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _compiled_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("gpu tests selected on a machine without CUDA")
    if interpreting():
        pytest.fail("gpu tests must run compiled: set TRITON_INTERPRET=0")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "group, head_dim, block_size", [(1, 64, 16), (4, 128, 16), (7, 128, 32), (4, 256, 16)]
)
@pytest.mark.parametrize("num_splits", [None, 1, 6])
def test_paged_attention_compiled(dtype, group, head_dim, block_size, num_splits) -> None:
    from pageserve_kernels.paged_attention import paged_attention

    q_lens, seq_lens = [1, 1, 17, 0, 1, 200], [1, 1023, 49, 7, 4100, 333]
    batch = make_batch(
        q_lens, seq_lens, n_q=2 * group, n_kv=2, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    ref = batch.reference()
    cuda = batch.to("cuda")
    out = torch.full_like(cuda.query, float("nan"))
    paged_attention(*cuda.args(), out=out, num_splits=num_splits)
    assert_close_to_reference(out.cpu(), ref, dtype)


def test_paged_attention_captures_in_a_cuda_graph() -> None:
    """With host hints the launcher never syncs, so a decode step can be graph-captured."""
    from pageserve_kernels.paged_attention import paged_attention

    batch = make_batch(
        [1] * 4, [30, 700, 5, 2048], n_q=8, n_kv=2, head_dim=128, block_size=16, dtype=torch.float16
    )
    cuda = batch.to("cuda")
    out = torch.empty_like(cuda.query)
    kwargs = {"max_query_len": 1, "max_seq_len": 2048, "out": out}
    paged_attention(*cuda.args(), **kwargs)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(*cuda.args(), **kwargs)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(out.cpu(), batch.reference(), torch.float16)


def test_write_kv_and_copy_blocks_compiled() -> None:
    from pageserve_kernels.copy_blocks import copy_blocks
    from pageserve_kernels.reference import copy_blocks_ref, write_kv_ref
    from pageserve_kernels.write_kv import write_kv

    k_cache = torch.randn(40, 16, 4, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    key, value = torch.randn(2, 33, 4, 128, device="cuda")
    slots = torch.randperm(640, device="cuda")[:33]
    slots[::5] = -1
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    pairs = torch.tensor([[3, 9], [0, 39], [12, 1]], device="cuda")
    copy_blocks([k_cache, v_cache], pairs)
    copy_blocks_ref([k_ref, v_ref], pairs)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
