"""The Triton paged-attention kernel against the float64 reference, in the interpreter."""

from __future__ import annotations

import itertools

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from pageserve_kernels import paged_attention as pa_module
from pageserve_kernels.checks import KernelArgError
from pageserve_kernels.paged_attention import paged_attention
from tests.kernels.factories import assert_close_to_reference, make_batch

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def run(batch, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.query, float("nan"))  # poisoned: every element must be written
    result = paged_attention(*batch.args(), out=out, **kwargs)
    assert result is out
    return out


def test_runs_in_the_interpreter() -> None:
    assert isinstance(pa_module._paged_attention_kernel, InterpretedFunction)


# (q_lens, seq_lens, n_q, n_kv, head_dim, block_size, dtype, kwargs)
REPRESENTATIVE = [
    pytest.param([1, 1, 1, 1], [1, 15, 17, 33], 8, 2, 64, 16, F32, {}, id="decode-gqa4-f32"),
    pytest.param([1, 1], [16, 64], 7, 1, 128, 32, F16, {}, id="decode-gqa7-full-blocks-hd128-f16"),
    pytest.param([1, 1, 1], [1, 31, 45], 2, 2, 64, 16, BF16, {}, id="decode-mha-bf16"),
    pytest.param([17, 15], [40, 15], 9, 3, 64, 16, F32, {}, id="prefill-chunks-on-cache-gqa3"),
    pytest.param([1, 0, 20, 1, 5], [9, 4, 20, 70, 37], 8, 2, 64, 16, F16, {}, id="mixed-with-idle-request"),
    pytest.param([1], [1023], 4, 1, 64, 16, F32, {}, id="decode-1023-auto-split"),
    pytest.param([1, 1], [1023, 17], 4, 1, 64, 32, BF16, {"num_splits": 5}, id="decode-split5-bf16"),
    pytest.param([12, 1], [50, 90], 4, 2, 64, 16, F32, {"num_splits": 3}, id="prefill-split-some-empty"),
    pytest.param([3, 1], [20, 41], 4, 4, 32, 32, F32, {"tile_n": 16}, id="tile-smaller-than-block"),
    pytest.param([2, 1], [19, 8], 6, 3, 80, 16, F16, {}, id="head-dim-80-padded"),
]


@pytest.mark.parametrize("q_lens, seq_lens, n_q, n_kv, head_dim, block_size, dtype, kwargs", REPRESENTATIVE)
def test_matches_reference(q_lens, seq_lens, n_q, n_kv, head_dim, block_size, dtype, kwargs) -> None:
    batch = make_batch(
        q_lens, seq_lens, n_q=n_q, n_kv=n_kv, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    assert_close_to_reference(run(batch, **kwargs), batch.reference(), dtype)


def test_host_hints_give_the_same_result() -> None:
    batch = make_batch([3, 1], [30, 12], n_q=4, n_kv=2, head_dim=64, block_size=16, dtype=F32)
    hinted = run(batch, max_query_len=3, max_seq_len=30)
    torch.testing.assert_close(hinted, run(batch), atol=0, rtol=0)


def test_strided_query_view_and_output() -> None:
    """The runner passes q as a view of the fused QKV projection: rows are strided."""
    batch = make_batch([4, 1], [20, 33], n_q=4, n_kv=1, head_dim=64, block_size=16, dtype=F32)
    qkv = torch.randn(5, 6, 64)  # (T, n_q + 2 * n_kv, hd)
    qkv[:, :4] = batch.query
    query = qkv[:, :4]  # stride(0) = 6 * 64
    assert not query.is_contiguous()
    out = torch.full((5, 4, 64), float("nan"))
    paged_attention(query, *batch.args()[1:], out=out)
    assert_close_to_reference(out, batch.reference(), F32)


def test_empty_batch_returns_empty() -> None:
    batch = make_batch([0], [5], n_q=2, n_kv=1, head_dim=16, block_size=16, dtype=F32)
    assert paged_attention(*batch.args()).shape == (0, 2, 16)


@pytest.mark.parametrize(
    "change, arg",
    [
        (lambda a: {**a, "query": a["query"].to(torch.int32)}, "query"),
        (lambda a: {**a, "query": a["query"][:, :3]}, "query"),  # 3 heads over 2 KV heads
        (lambda a: {**a, "value_cache": a["value_cache"].half()}, "value_cache"),
        (lambda a: {**a, "seq_lens": a["seq_lens"].float()}, "seq_lens"),
        (lambda a: {**a, "query_start_loc": a["query_start_loc"][:-1]}, "query_start_loc"),
        (lambda a: {**a, "key_cache": a["key_cache"].transpose(2, 3)}, "key_cache"),
    ],
)
def test_bad_arguments_raise_a_typed_error(change, arg) -> None:
    batch = make_batch([1, 2], [5, 9], n_q=4, n_kv=2, head_dim=16, block_size=16, dtype=F32)
    names = ["query", "key_cache", "value_cache", "block_tables", "query_start_loc", "seq_lens", "scale"]
    kwargs = change(dict(zip(names, batch.args(), strict=True)))
    with pytest.raises(KernelArgError) as info:
        paged_attention(**kwargs)
    assert info.value.arg == arg


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch) -> None:
    batch = make_batch([1], [5], n_q=2, n_kv=1, head_dim=16, block_size=16, dtype=F32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelArgError, match="TRITON_INTERPRET"):
        paged_attention(*batch.args())


def _full_grid():
    shapes = {  # name: (q_lens, seq_lens)
        "decode": ([1, 1, 1, 1, 1], [1, 15, 17, 32, 1023]),
        "chunks": ([1, 17, 15, 1], [16, 49, 15, 300]),
    }
    for (name, (q_lens, seq_lens)), dtype, group, hd, bs in itertools.product(
        shapes.items(), (F32, F16, BF16), (1, 4, 7), (64, 128), (16, 32)
    ):
        yield pytest.param(
            q_lens, seq_lens, group, hd, bs, dtype, id=f"{name}-{dtype}-g{group}-hd{hd}-bs{bs}"
        )


@pytest.mark.kernel_full
@pytest.mark.parametrize("q_lens, seq_lens, group, head_dim, block_size, dtype", list(_full_grid()))
def test_full_grid(q_lens, seq_lens, group, head_dim, block_size, dtype) -> None:
    batch = make_batch(
        q_lens, seq_lens, n_q=2 * group, n_kv=2, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    assert_close_to_reference(run(batch), batch.reference(), dtype)


@pytest.mark.kernel_full
@pytest.mark.parametrize("num_splits", [2, 7, 16])
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_full_grid_forced_splits(num_splits, dtype) -> None:
    batch = make_batch([1, 1, 4], [1023, 5, 600], n_q=8, n_kv=2, head_dim=64, block_size=16, dtype=dtype)
    assert_close_to_reference(run(batch, num_splits=num_splits), batch.reference(), dtype)


@pytest.mark.kernel_full
@pytest.mark.parametrize("seed", range(24))
def test_random_batches(seed) -> None:
    """Random mixes of idle requests, decodes, fresh prompts and chunks over cached context."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    batch_size = int(torch.randint(1, 7, (1,), generator=gen))
    q_lens = [pick([0, 1, 1, 1, 3, 16, 17, 40]) for _ in range(batch_size)]
    seq_lens = [q + pick([0, 0, 1, 15, 31, 64, 130]) for q in q_lens]
    seq_lens = [max(s, 1) for s in seq_lens]
    group, n_kv, dtype = pick([1, 2, 4, 7]), pick([1, 2]), pick([F32, F16, BF16])
    head_dim, block_size = pick([16, 32, 64]), pick([16, 32])
    batch = make_batch(
        q_lens, seq_lens, n_q=group * n_kv, n_kv=n_kv, head_dim=head_dim, block_size=block_size,
        dtype=dtype, seed=seed,
    )  # fmt: skip
    splits = pick([None, None, 2, 5])
    assert_close_to_reference(run(batch, num_splits=splits), batch.reference(), dtype)
