"""pageserve_kernels/cpu_decode.py: every loop variant this host runs against the scalar one (the spec),
the variants built match the CPU's flags, and the per-host pick is timed, forced or cached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pageserve_kernels import choice, cpu_decode
from pageserve_kernels import reference as ref
from pageserve_kernels.cpu_features import cpu_flags

KERNEL = cpu_decode.load()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C compiler here: the native decode kernel cannot be built")
BUILT = KERNEL.variants if KERNEL is not None else ()
FAST = [v for v in BUILT if v != "scalar"]


@pytest.fixture(autouse=True)
def _own_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    monkeypatch.delenv(choice.RETUNE_ENV, raising=False)


def _decode_batch(seq_lens: list[int], n_q: int, n_kv: int, hd: int, bs: int, dtype: torch.dtype, seed: int):
    """Decode rows over a paged cache whose unused slots are NaN; queries strided like a q|k slice."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-s // bs) for s in seq_lens]
    num_blocks = sum(blocks) + 3
    kc = torch.full((num_blocks, bs, n_kv, hd), float("nan"), dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks)
    tables, used = [], 0
    for n, s in zip(blocks, seq_lens, strict=True):
        table = perm[used : used + n]
        used += n
        for p in range(s):
            kc[table[p // bs], p % bs] = torch.randn(n_kv, hd, generator=gen).to(dtype)
            vc[table[p // bs], p % bs] = torch.randn(n_kv, hd, generator=gen).to(dtype)
        tables.append(table + [0] * (width - n))
    fused = torch.randn(len(seq_lens), n_q + n_kv, hd, generator=gen).to(dtype)
    rows = torch.arange(len(seq_lens), dtype=torch.int64)
    return (fused[:, :n_q], kc, vc, rows, torch.tensor(tables, dtype=torch.int64),
            torch.tensor(seq_lens, dtype=torch.int64), max(seq_lens), hd**-0.5)


def _run(variant: str, args: tuple) -> torch.Tensor:
    query = args[0]
    out = torch.empty(query.shape, dtype=query.dtype)
    KERNEL(out, *args, variant=variant)  # type: ignore[misc]
    return out


def test_the_build_has_every_variant_this_cpu_runs() -> None:
    flags = cpu_flags()
    assert "scalar" in BUILT
    assert ("avx2" in BUILT) == ({"avx2", "fma"} <= flags)
    assert ("avx512" in BUILT) == ({"avx2", "fma", "avx512f", "avx512bw"} <= flags)
    assert ("avx512_bf16" in BUILT) == ("avx512" in BUILT and "avx512_bf16" in flags)


# (n_q, n_kv, hd, block size): GQA groups of 3 (the model), 8 (two tiles of four heads), 5 (four + one),
# 1 and 2; head sizes 64 (four-register tiles), 96 (64 + a two-register rest), 128, 32, and 80 and 24
# (no AVX-512 path: those variants fall back); blocks of 16 (full 16-token tiles) and 5 or 7.
SHAPES = [(9, 3, 64, 16), (16, 2, 96, 5), (10, 2, 128, 16), (4, 4, 32, 7), (6, 3, 80, 16), (6, 2, 24, 5),
          (5, 1, 64, 7)]
LENS = [1, 15, 16, 17, 33, 70, 131, 5]  # contexts ending inside a 16-token tile, on it, single tokens


@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "q{}-kv{}-hd{}-bs{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("requests", [2, 8])  # few: a task per KV head; more: a task per request
def test_each_variant_matches_the_scalar_loops(variant: str, shape: tuple, dtype: torch.dtype, requests: int) -> None:
    n_q, n_kv, hd, bs = shape
    args = _decode_batch(LENS[:requests], n_q, n_kv, hd, bs, dtype, seed=hd + bs + requests)
    got, spec = _run(variant, args), _run("scalar", args)
    assert not got.isnan().any()
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3}[dtype]  # bf16: one unit in the last place of the output
    torch.testing.assert_close(got.float(), spec.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_scalar_loops_match_the_reference(dtype: torch.dtype) -> None:
    args = _decode_batch(LENS, 9, 3, 64, 16, dtype, seed=5)
    query, kc, vc, _, tables, lens, _, scale = args
    starts = torch.arange(len(LENS) + 1, dtype=torch.int32)
    want = ref.paged_attention_ref(query.contiguous(), kc, vc, tables.int(), starts, lens.int(), scale)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(_run("scalar", args).float(), want.float(), atol=tol, rtol=tol)


def test_applicable_variants_follow_dtype_and_head_size() -> None:
    assert KERNEL is not None
    assert "avx512_bf16" not in KERNEL.applicable(torch.float32, 64)
    assert not any(v.startswith("avx512") for v in KERNEL.applicable(torch.bfloat16, 80))
    assert set(KERNEL.applicable(torch.bfloat16, 64)) == set(BUILT)


def test_the_pick_is_timed_among_applicable_variants_and_cached() -> None:
    kernel = cpu_decode.NativeDecode.__new__(cpu_decode.NativeDecode)
    kernel.__dict__.update(KERNEL.__dict__, _picks={})  # type: ignore[union-attr]
    picked = kernel.pick(torch.bfloat16, 9, 3, 64, 16)
    timed = kernel.candidates(torch.bfloat16, 64)
    assert picked in timed and set(timed) == (set(BUILT) - {"scalar"} or {"scalar"})
    stored = choice.cached_choices()["decode_attention|bfloat16 n_q=9 n_kv=3 hd=64 block=16"]
    assert stored["pick"] == picked and set(stored["seconds"]) == set(timed)


def test_a_forced_variant_is_the_one_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.FORCE_ENV, "decode_attention=scalar")
    kernel = cpu_decode.NativeDecode.__new__(cpu_decode.NativeDecode)
    kernel.__dict__.update(KERNEL.__dict__, _picks={})  # type: ignore[union-attr]
    args = _decode_batch(LENS, 9, 3, 64, 16, torch.float32, seed=3)
    out = torch.empty(args[0].shape, dtype=torch.float32)
    kernel(out, *args)
    assert kernel.pick(torch.float32, 9, 3, 64, 16) == "scalar"
    assert torch.equal(out, _run("scalar", args))  # bit for bit: the same loops ran
    vectorised = [v for v in kernel.applicable(torch.float32, 64) if v != "scalar"]
    if vectorised:  # and not a vector variant's (whose float32 sums round differently somewhere)
        assert not torch.equal(out, _run(vectorised[-1], args))


def _shared_prefix_batch(groups: list[tuple[int, list[int]]], n_q: int, n_kv: int, hd: int, bs: int,
                         dtype: torch.dtype, seed: int):
    """_decode_batch's layout, but each group's requests begin with the same `shared` blocks (a system prompt
    kept once; 0: requests of their own), a request shorter than them reading just its part; requests of all
    groups interleaved, their decode rows anywhere in the step's query."""
    gen = torch.Generator().manual_seed(seed)
    lens = [s for _, group in groups for s in group]
    own = [max(0, -(-s // bs) - shared) for shared, group in groups for s in group]
    num_blocks = sum(shared for shared, _ in groups) + sum(own) + 3
    kc = torch.full((num_blocks, bs, n_kv, hd), float("nan"), dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    perm, used, tables = torch.randperm(num_blocks, generator=gen).tolist(), 0, []

    def fill(table: list[int], positions: range) -> None:
        for p in positions:
            kc[table[p // bs], p % bs] = torch.randn(n_kv, hd, generator=gen).to(dtype)
            vc[table[p // bs], p % bs] = torch.randn(n_kv, hd, generator=gen).to(dtype)

    for shared, group in groups:
        common = perm[used : used + shared]
        used += shared
        fill(common, range(shared * bs))
        for s in group:
            n = max(0, -(-s // bs) - shared)
            table = common + perm[used : used + n]
            used += n
            fill(table, range(shared * bs, s))
            tables.append(table)
    order = torch.randperm(len(lens), generator=gen).tolist()  # the groups' requests interleaved
    width = max(len(t) for t in tables)
    tables = [tables[i] + [0] * (width - len(tables[i])) for i in order]
    fused = torch.randn(len(lens), n_q + n_kv, hd, generator=gen).to(dtype)
    rows = torch.randperm(len(lens), generator=gen)
    return (fused[:, :n_q], kc, vc, rows, torch.tensor(tables, dtype=torch.int64),
            torch.tensor([lens[i] for i in order], dtype=torch.int64), max(lens), hd**-0.5)


# (groups of (shared blocks, requests' lengths), shape): 12 requests (the fewest that share by tiles); 20 (two
# tiles), one of them ending inside the shared blocks (only the blocks before its last token are shared then);
# blocks of 5, one request whose last token opens the block after them; two prompts' groups beside requests
# of their own and a group of 11 (too few to share).
SHARED = [([(4, [64 + 1 + 7 * i for i in range(12)])], (9, 3, 64, 16)),
          ([(3, [48 + 1 + 11 * i for i in range(19)] + [40])], (9, 3, 64, 16)),
          ([(9, [45 + 3 * i for i in range(12)] + [46, 200])], (16, 2, 96, 5)),
          ([(2, [33] * 12)], (10, 2, 128, 16)),
          ([(3, [50 + i for i in range(12)]), (5, [81 + 5 * i for i in range(14)]), (0, [20, 70, 3]),
            (4, [65 + i for i in range(11)])], (9, 3, 64, 16))]


@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("case", SHARED, ids=lambda c: "groups" + "-".join(f"{s}x{len(g)}" for s, g in c[0]) +
                         "-hd{}-bs{}".format(*c[1][2:]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_requests_sharing_their_first_blocks_match_the_scalar_loops(variant: str, case: tuple,
                                                                   dtype: torch.dtype) -> None:
    groups, (n_q, n_kv, hd, bs) = case
    args = _shared_prefix_batch(groups, n_q, n_kv, hd, bs, dtype, seed=len(groups) + hd + bs)
    got, spec = _run(variant, args), _run("scalar", args)
    assert not got.isnan().any()
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.float(), spec.float(), atol=tol, rtol=tol)
    query, kc, vc, rows, tables, seq_lens, _, scale = args
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    # request b's query and output are row rows[b] of the step's
    want = ref.paged_attention_ref(query[rows].contiguous(), kc, vc, tables.int(), starts, seq_lens.int(), scale)
    torch.testing.assert_close(got[rows].float(), want.float(), atol=2e-2, rtol=2e-2)


def _tables(prefixes: list[list[int]], own: int = 2, start: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables beginning with the given block ids, then `own` blocks of each request's own (16 tokens a
    block, the last one half full)."""
    width = max(len(p) for p in prefixes) + own
    rows, lens = [], []
    for i, p in enumerate(prefixes):
        blocks = p + list(range(start + i * own, start + (i + 1) * own))
        rows.append(blocks + [0] * (width - len(blocks)))
        lens.append(16 * (len(blocks) - 1) + 8)
    return torch.tensor(rows), torch.tensor(lens)


@pytest.mark.skipif("avx512" not in BUILT, reason="the shared-prefix tiles are built with the AVX-512 variants")
def test_the_plan_tiles_each_group_sharing_32_tokens_and_leaves_an_odd_request_out() -> None:
    assert KERNEL is not None
    prompt = list(range(10, 16))  # six blocks, 96 tokens, in twelve requests
    cases = [
        ([prompt] * 12, [6] * 12),
        # one request whose first two blocks only are the prompt's, sorted before or after the twelve
        ([prompt] * 12 + [prompt[:2] + [1]], [6] * 12 + [0]),
        ([prompt] * 12 + [prompt[:2] + [99]], [6] * 12 + [0]),
        # two prompts' groups, and eleven requests of a third: too few to tile
        ([prompt] * 12 + [[20, 21, 22]] * 13 + [[30, 31]] * 11, [6] * 12 + [3] * 13 + [0] * 11),
        ([[40]] * 12, [0] * 12),  # 16 tokens: too few to share
        ([prompt] * 11, [0] * 11),
    ]
    for prefixes, want in cases:
        order = torch.randperm(len(prefixes), generator=torch.Generator().manual_seed(len(prefixes))).tolist()
        tables, lens = _tables([prefixes[i] for i in order])
        assert KERNEL.shared_blocks(tables, lens, 16) == [want[i] for i in order], prefixes
