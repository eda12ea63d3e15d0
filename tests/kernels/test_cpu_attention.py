"""pageserve_kernels/cpu_attention.py against pageserve_kernels/reference.py: odd shapes, mixed batches, NaN-poisoned caches."""

from __future__ import annotations

import functools
import shutil

import pytest
import torch

from pageserve_kernels import cpu_attention as ca
from pageserve_kernels import cpu_attention_plan as cap
from pageserve_kernels import cpu_decode, cpu_prefill, native_build
from pageserve_kernels import reference as ref


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once with decodes in the C kernel and once on the pure-PyTorch fallback."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_decode, "load", lambda: None)
    elif cpu_decode.load() is None:
        pytest.skip("no C compiler here: the native decode kernel cannot be built")
    return str(request.param)


def test_native_kernel_builds_where_a_compiler_exists() -> None:
    if shutil.which("cc") or shutil.which("gcc"):
        assert cpu_decode.load() is not None


def _batch(q_lens, seq_lens, *, n_q=6, n_kv=2, hd=24, block_size=5, dtype=torch.float32, seed=0):
    """A paged batch whose unused slots are NaN (reading one poisons the output)."""
    gen = torch.Generator().manual_seed(seed)
    nb_per = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = sum(nb_per) + 7
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    kc = torch.full((num_blocks, block_size, n_kv, hd), float("nan"), dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    max_blocks = max(nb_per) + 2
    tables, used = [], 0
    for n, s in zip(nb_per, seq_lens, strict=True):
        t = perm[used : used + n]
        used += n
        tables.append(t + [perm[-1]] * (max_blocks - n))  # spare entries point at a NaN block
        for p in range(s):
            kc[t[p // block_size], p % block_size] = torch.randn(n_kv, hd, generator=gen).to(dtype)
            vc[t[p // block_size], p % block_size] = torch.randn(n_kv, hd, generator=gen).to(dtype)
    query = torch.randn(sum(q_lens), n_q, hd, generator=gen).to(dtype)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return (
        query,
        kc,
        vc,
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        hd**-0.5,
    )


CASES = {
    "decode_only": ([1] * 7, [1, 5, 6, 33, 17, 70, 4]),
    "fresh_prefills": ([13, 1, 29], [13, 9, 29]),
    "continued_chunks": ([7, 11, 1, 3], [19, 11, 64, 41]),
    "mixed_with_empty": ([1, 0, 9, 1, 1], [23, 8, 30, 2, 16]),
    "gqa_ratio_1": ([2, 1, 5], [8, 12, 5]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_reference(case: str, dtype: torch.dtype, decode_path: str) -> None:
    q_lens, seq_lens = CASES[case]
    n_q, n_kv = (4, 4) if case == "gqa_ratio_1" else (6, 2)
    args = _batch(q_lens, seq_lens, n_q=n_q, n_kv=n_kv, dtype=dtype)
    out = ca.paged_attention(*args)
    want = ref.paged_attention_ref(*args)
    rows = torch.cat(
        [torch.arange(a, b) for a, b in zip(args[4][:-1].tolist(), args[4][1:].tolist(), strict=True)]
    )
    assert not out[rows].isnan().any()
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out[rows].float(), want[rows].float(), atol=tol, rtol=tol)


def test_fresh_kv_path_equals_cache_path(decode_path: str) -> None:
    """The model's path (K/V of fresh prefills taken from the step) matches reading the cache."""
    q_lens, seq_lens = [9, 1, 4, 1], [9, 30, 12, 3]
    query, kc, vc, tables, qsl, sl, scale = _batch(q_lens, seq_lens)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    block_tables = [t[: (s + 4) // 5] for t, s in zip(tables.tolist(), seq_lens, strict=True)]
    plan = ca.plan_attention(q_lens, seq_lens, block_tables, 5, native=decode_path == "native")
    assert (plan.native_decode is not None) == (decode_path == "native")
    flat_k = kc.view(-1, *kc.shape[2:])[plan.slot_mapping]  # (T, n_kv, hd): what the step computed
    flat_v = vc.view(-1, *vc.shape[2:])[plan.slot_mapping]
    fast = ca.attend(query, kc, vc, plan, scale, fresh_kv=(flat_k, flat_v))
    want = ref.paged_attention_ref(query, kc, vc, tables, qsl, sl, scale)
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=1e-5)


def test_write_kv_matches_reference_and_skips_padding() -> None:
    gen = torch.Generator().manual_seed(1)
    key, value = torch.randn(6, 3, 8, generator=gen), torch.randn(6, 3, 8, generator=gen)
    slots = torch.tensor([3, 17, -1, 0, 22, 9])
    caches = [torch.zeros(5, 5, 3, 8) for _ in range(4)]
    ca.write_kv(key, value, caches[0], caches[1], slots)
    ref.write_kv_ref(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].view(-1, 3, 8)[17].equal(key[1])


def test_slot_mapping_crosses_block_boundaries() -> None:
    # request 0: positions 3..7 of table [4, 1] (block 4, then block 1); request 1: position 5 of [2, 0]
    assert cap.compute_slot_mapping([5, 1], [8, 6], [[4, 1], [2, 0]], 4) == [19, 4, 5, 6, 7, 1]


def test_decode_bucketing_groups_similar_lengths() -> None:
    blocks = [40, 39, 38, 3, 2, 2, 1]
    groups = cap._bucket(blocks, list(range(7)))
    assert sorted(sum(groups, [])) == list(range(7))
    assert [0, 1, 2] in groups  # long ones together, short ones not padded to 40 blocks
    assert len(groups) <= cap.MAX_DECODE_GROUPS


def test_native_decode_reads_strided_queries_and_wide_groups(decode_path: str) -> None:
    """Queries sliced out of a fused q|k tensor (row stride > n_q * hd), GQA group of 8, head_dim 80."""
    q_lens, seq_lens = [1, 1, 1], [50, 1, 17]
    _, kc, vc, tables, qsl, sl, scale = _batch(q_lens, seq_lens, n_q=16, n_kv=2, hd=80)
    fused = torch.randn(3, 18, 80)  # 16 query heads then 2 key heads, as the model lays them out
    query = fused[:, :16]
    out = ca.paged_attention(query, kc, vc, tables, qsl, sl, scale)
    want = ref.paged_attention_ref(query.contiguous(), kc, vc, tables, qsl, sl, scale)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hd", [64, 96, 128])
@pytest.mark.parametrize("num_requests", [2, 21])  # few: split by KV head; many: one task per request
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_vector_paths(hd: int, num_requests: int, block_size: int, dtype: torch.dtype,
                                    decode_path: str) -> None:
    """Head sizes the AVX2 loops take (64-column register tiles, a 32-column rest at 96), contexts
    that end inside an 8-token tile and inside a block, one task per request or per KV head."""
    gen = torch.Generator().manual_seed(hd + num_requests + block_size)
    ends = [130, 9, 1, 7, 8, 16, 17]  # 8-token tiles and blocks cut short, single tokens
    seq_lens = (ends + torch.randint(1, 140, (num_requests,), generator=gen).tolist())[:num_requests]
    args = _batch([1] * num_requests, seq_lens, n_q=9, n_kv=3, hd=hd, block_size=block_size, dtype=dtype)
    out = ca.paged_attention(*args)
    want = ref.paged_attention_ref(*args)
    assert not out.isnan().any()
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)


PREFILL_MIX = ([37, 1, 16, 50, 3, 2], [37, 20, 116, 53, 3, 40])  # fresh, decode, continued after 100, ...


def _widened(args: tuple) -> tuple:
    """The same batch in float32: what the kernel computes in, whatever the tensors' dtype."""
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


@functools.cache
def _build_without_avx512() -> cpu_prefill.NativePrefill | None:
    """The prefill kernel compiled with -mno-avx512f: the loops an AVX2-only host runs, run on this one too."""
    if cpu_prefill.load() is None:
        return None
    flags = (*native_build.FLAGS, "-mno-avx512f")
    lib = native_build.try_load("prefill_attention_avx2", native_build.kernel_source("prefill_attention"), flags)
    return None if lib is None else cpu_prefill.NativePrefill(lib)


@pytest.mark.parametrize(("build", "dtype", "dots"), [
    ("native", torch.float32, 0), ("native", torch.bfloat16, 0), ("native", torch.bfloat16, 1),
    ("native", torch.bfloat16, 2),  # AMX tiles
    ("no-avx512", torch.float32, 0), ("no-avx512", torch.bfloat16, 0),  # dot products need AVX-512
])
@pytest.mark.parametrize("block_size", [16, 5, 32])
@pytest.mark.parametrize(("hd", "n_q", "n_kv"), [(64, 9, 3), (16, 4, 4), (32, 8, 1), (48, 12, 1)])
def test_native_prefill_matches_reference(block_size: int, hd: int, n_q: int, n_kv: int, dtype: torch.dtype,
                                          dots: int, build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt chunks in the C kernel: fresh and continued, any block size, NaN in every unused slot.

    bfloat16: the float32 attention of the same (bfloat16) values, rounded once: within one
    bfloat16 rounding step of it (2^-8 relative), far tighter than a bfloat16 computation would be;
    every way of taking the products the host runs (keys widened to float32, AVX512-BF16 dot products for
    Q . K^T, or both products on AMX tiles with P in two bfloat16 parts).
    12 query heads on one KV head: 12 x 32 rows per tile, past the dot products' eight-row groups.
    """
    kernel = cpu_prefill.load() if build == "native" else _build_without_avx512()
    if kernel is None:
        pytest.skip("no AVX2+FMA or no C compiler: the native prefill kernel cannot be built")
    monkeypatch.setattr(cpu_prefill, "load", lambda: kernel)
    if dots == 1 and not kernel.has_dot_products:
        pytest.skip("no AVX512-BF16 on this host: the dot-product path is not built here")
    if dots == 2 and not kernel.has_amx:
        pytest.skip("no AMX-BF16 on this host: the tile path is not built here")
    monkeypatch.setattr(kernel, "dot_products", dots)
    q_lens, seq_lens = PREFILL_MIX
    args = _batch(q_lens, seq_lens, n_q=n_q, n_kv=n_kv, hd=hd, block_size=block_size, seed=hd + block_size,
                  dtype=dtype)
    tables = [args[3][i, : (s + block_size - 1) // block_size].tolist() for i, s in enumerate(seq_lens)]
    plan = ca.plan_attention(q_lens, seq_lens, tables, block_size, native=True)
    assert plan.native_prefill is not None and plan.native_prefill.lens.tolist() == [37, 16, 50, 3, 2]
    assert plan.native_prefill.context_lens.tolist() == [0, 100, 3, 0, 38]
    out = ca.paged_attention(*args)
    assert out.dtype == dtype and not out.isnan().any()
    want = ref.paged_attention_ref(*_widened(args))
    if dtype == torch.float32:
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(out.float(), want, atol=1e-5, rtol=2**-8)


def test_prefill_kernel_is_skipped_where_it_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head size that is no multiple of 16, or float16, keeps scaled_dot_product_attention."""
    if cpu_prefill.load() is None:
        pytest.skip("no AVX2+FMA or no C compiler: the native prefill kernel cannot be built")
    calls = []
    real = cpu_prefill.NativePrefill.__call__
    monkeypatch.setattr(cpu_prefill.NativePrefill, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    q_lens, seq_lens = PREFILL_MIX
    for dtype, hd, used in ((torch.bfloat16, 64, True), (torch.float16, 64, False), (torch.float32, 24, False),
                            (torch.float32, 64, True)):
        args = _batch(q_lens, seq_lens, n_q=6, n_kv=2, hd=hd, block_size=16, dtype=dtype)
        calls.clear()
        out = ca.paged_attention(*args)
        assert bool(calls) == used
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref.paged_attention_ref(*_widened(args)), atol=tol, rtol=tol)


@pytest.mark.parametrize("build", ["native", "no-avx512"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rescales_on_each_new_maximum(build: str, dtype: torch.dtype) -> None:
    """Scores that grow by 10 a key: each block's maximum is ~160 above the last one's, so exp(score -
    first maximum) overflows unless the running output and sum are rescaled on every new maximum."""
    kernel = cpu_prefill.load() if build == "native" else _build_without_avx512()
    if kernel is None:
        pytest.skip("no AVX2+FMA or no C compiler: the native prefill kernel cannot be built")
    n, hd = 48, 16
    keys = (torch.arange(n, dtype=torch.float32) * 2.5)[:, None].expand(n, hd)  # q . k * 0.25 = 10 j
    kc = keys.reshape(n // 16, 16, 1, hd).to(dtype).contiguous()
    vc = torch.randn(n // 16, 16, 1, hd).to(dtype)
    q = torch.ones(n, 1, hd, dtype=dtype)
    out = torch.empty_like(q)
    one = torch.tensor([n], dtype=torch.int64)
    kernel(out, q, kc, vc, torch.zeros(1, dtype=torch.int64), one, torch.zeros(1, dtype=torch.int64),
           torch.arange(n // 16, dtype=torch.int64)[None].contiguous(), 0.25)
    # each query t sees keys 0..t; key t outweighs the rest by e^10 at least: out[t] is V[t]
    torch.testing.assert_close(out.float()[:, 0], vc.reshape(n, hd).float(), atol=1e-3, rtol=1e-3)
