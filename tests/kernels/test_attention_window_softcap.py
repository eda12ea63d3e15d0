"""Sliding windows and logit soft-capping in every attention path, against pageserve_kernels/reference.py.

Each batch mixes decodes, fresh prompts and prompt chunks continuing a cached context, over a paged cache
whose unused slots hold NaN. The queries are scaled so that scaled scores reach ~10: a soft-cap of 5
changes them. With a window, every block lying wholly before the window of a request's first query is
NaN too (`poison_outside_window`): a path that reads one returns NaN, so "the output equals the
reference" also proves that the blocks outside the window are not read.

Tolerances against the float64 reference: factories.TOLERANCE, float32 (2e-5 abs, 1e-5 rel) and
bfloat16 (2e-2, 2e-2: one bfloat16 rounding of the output, and of the probabilities on the PyTorch paths).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pageserve_kernels import cpu_attention as ca
from pageserve_kernels import cpu_decode, cpu_prefill
from pageserve_kernels import reference as ref
from pageserve_kernels.checks import KernelArgError
from pageserve_kernels.cpu_attention_plan import compute_slot_mapping
from pageserve_kernels.dispatch import select_backend
from tests.kernels.factories import AttentionBatch, assert_close_to_reference, make_batch
from tests.kernels.test_cpu_attention import _build_without_avx512
from tests.kernels.test_cpu_decode_variants import _shared_prefix_batch

# (window, softcap): smaller than most sequences and no multiple of either block size; longer than every
# sequence (the same as none); a cap that bites; both.
SETTINGS = [(13, 0.0), (1000, 0.0), (0, 5.0), (13, 5.0)]
IDS = [f"window{w}-softcap{c:g}" for w, c in SETTINGS]
DTYPES = [torch.float32, torch.bfloat16]
# decodes (1 token), fresh prompts (q == seq) and chunks continuing a cached context (q < seq)
MIXED = ([1, 37, 1, 16, 1, 50, 3], [70, 37, 9, 100, 130, 53, 40])
DECODES = ([1] * 6, [70, 9, 130, 13, 64, 100])


def _batch(mix: tuple[list[int], list[int]], dtype: torch.dtype, block_size: int = 5, hd: int = 32,
           n_q: int = 6, n_kv: int = 2, seed: int = 0) -> AttentionBatch:
    batch = make_batch(*mix, n_q=n_q, n_kv=n_kv, head_dim=hd, block_size=block_size, dtype=dtype, seed=seed)
    # scaled scores of order 10 (std ~4): a soft-cap of 5 changes them
    return dataclasses.replace(batch, query=(batch.query.float() * 4).to(dtype))


def _reference_then_poison(batch: AttentionBatch, window: int, softcap: float) -> torch.Tensor:
    """The reference output, then NaN into every block outside the windows (checked to be some)."""
    want = batch.reference(window, softcap)
    poisoned = batch.poison_outside_window(window) if window else 0
    assert window in (0, 1000) or poisoned > 0, "the batch has no block outside the window: the test proves less"
    return want


def test_the_reference_follows_transformers_masks() -> None:
    """The definition itself: a window of w keeps keys p - w < k <= p; a soft-cap is softcap * tanh(x / softcap)."""
    hd, seq = 8, 11
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(3, 4, 1, hd, generator=gen, dtype=torch.float64)
    vc = torch.randn(3, 4, 1, hd, generator=gen, dtype=torch.float64)
    q = torch.randn(seq, 1, hd, generator=gen, dtype=torch.float64) * 4
    table, starts, lens = torch.tensor([[2, 0, 1]]), torch.tensor([0, seq]), torch.tensor([seq])
    k = ref.gather_kv_ref(kc, table[0], seq)[:, 0]  # (S, hd)
    v = ref.gather_kv_ref(vc, table[0], seq)[:, 0]
    for window, softcap in [(3, 0.0), (0, 2.0), (4, 2.0)]:
        scores = q[:, 0] @ k.T * 0.5
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        p, kk = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
        seen = (kk <= p) & ((kk > p - window) if window else True)
        want = torch.softmax(scores.masked_fill(~seen, -math.inf), -1) @ v
        got = ref.paged_attention_ref(q, kc, vc, table, starts, lens, 0.5, window, softcap)
        torch.testing.assert_close(got[:, 0], want)


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C decode and prefill kernels, or PyTorch's decode groups and prompt chunks."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_decode, "load", lambda: None)
    elif cpu_decode.load() is None:
        pytest.skip("no C compiler here: the native kernels cannot be built")
    return str(request.param)


@pytest.mark.parametrize(("window", "softcap"), SETTINGS, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_attention_matches_reference(window: int, softcap: float, dtype: torch.dtype, decode_path: str) -> None:
    batch = _batch(MIXED, dtype)
    want = _reference_then_poison(batch, window, softcap)
    out = ca.paged_attention(*batch.args(), window=window, softcap=softcap)
    assert_close_to_reference(out, want, dtype)


@pytest.mark.parametrize(("window", "softcap"), SETTINGS, ids=IDS)
def test_fresh_prompts_from_their_own_kv(window: int, softcap: float) -> None:
    """The engine's fresh prompts attend to this step's K/V (no cache trip, no is_causal once windowed)."""
    q_lens = seq_lens = [37, 2, 20]  # one token would be planned as a decode (which reads the cache)
    batch = _batch((q_lens, seq_lens), torch.float32)
    want = batch.reference(window, softcap)
    tables = [batch.block_tables[i, : -(-s // 5)].tolist() for i, s in enumerate(seq_lens)]
    k = torch.cat([ref.gather_kv_ref(batch.key_cache, batch.block_tables[i], s) for i, s in enumerate(seq_lens)])
    v = torch.cat([ref.gather_kv_ref(batch.value_cache, batch.block_tables[i], s) for i, s in enumerate(seq_lens)])
    plan = ca.plan_attention(q_lens, seq_lens, tables, 5, native=False)
    nan_cache = torch.full_like(batch.key_cache, math.nan)  # the fresh path must not read the cache at all
    out = ca.attend(batch.query, nan_cache, nan_cache, plan, batch.scale, fresh_kv=(k, v), window=window,
                    softcap=softcap)
    assert_close_to_reference(out, want, torch.float32)


DECODE = cpu_decode.load()
DECODE_VARIANTS = DECODE.variants if DECODE is not None else ()


@pytest.mark.skipif(DECODE is None, reason="no C compiler here: the native decode kernel cannot be built")
@pytest.mark.parametrize("variant", DECODE_VARIANTS)
@pytest.mark.parametrize(("window", "softcap"), SETTINGS, ids=IDS)
@pytest.mark.parametrize(("dtype", "block_size", "hd"), [(torch.float32, 5, 32), (torch.bfloat16, 16, 64)])
def test_windowed_decode_reads_only_the_blocks_inside_its_window(
    variant: str, window: int, softcap: float, dtype: torch.dtype, block_size: int, hd: int
) -> None:
    """Every C decode loop (scalar, AVX2, AVX-512, AVX512-BF16) with the blocks outside the window NaN."""
    assert DECODE is not None
    batch = _batch(DECODES, dtype, block_size=block_size, hd=hd)
    want = _reference_then_poison(batch, window, softcap)
    out = torch.empty_like(batch.query)
    rows = torch.arange(len(DECODES[0]))
    DECODE(out, batch.query, batch.key_cache, batch.value_cache, rows, batch.block_tables.long(),
           batch.seq_lens.long(), max(DECODES[1]), batch.scale, variant, window=window, softcap=softcap)
    assert_close_to_reference(out, want, dtype)


@pytest.mark.skipif("avx512" not in DECODE_VARIANTS, reason="the shared-prefix tiles come with the AVX-512 loops")
@pytest.mark.parametrize("variant", [v for v in DECODE_VARIANTS if v.startswith("avx512")])
@pytest.mark.parametrize(("window", "softcap"), [(0, 5.0), (50, 5.0), (50, 0.0)])
def test_requests_sharing_their_first_blocks(variant: str, window: int, softcap: float) -> None:
    """14 requests beginning with the same 48 tokens: the shared-prefix tiles cap their scores too (a window
    leaves them out: each request then starts at its own window)."""
    assert DECODE is not None
    lens = [49 + 9 * i for i in range(14)]
    query, kc, vc, rows, tables, seq_lens, max_seq, scale = _shared_prefix_batch([(3, lens)], 6, 2, 64, 16,
                                                                               torch.float32, seed=3)
    assert DECODE.shared_blocks(tables, seq_lens, 16) is not None  # the batch is tiled when windowless
    query = query * 4
    out = torch.empty(query.shape)
    DECODE(out, query, kc, vc, rows, tables, seq_lens, max_seq, scale, variant, window=window, softcap=softcap)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    want = ref.paged_attention_ref(query[rows].double(), kc.double(), vc.double(), tables.int(), starts,
                                   seq_lens.int(), scale, window, softcap)
    assert_close_to_reference(out[rows], want, torch.float32)


PREFILL_BUILDS = [("native", torch.float32, 0), ("native", torch.bfloat16, 0), ("native", torch.bfloat16, 1),
                  ("native", torch.bfloat16, 2), ("no-avx512", torch.float32, 0)]


@pytest.mark.parametrize(("build", "dtype", "dots"), PREFILL_BUILDS)
@pytest.mark.parametrize(("window", "softcap"), SETTINGS, ids=IDS)
def test_prefill_kernel_skips_tiles_outside_the_window(
    build: str, dtype: torch.dtype, dots: int, window: int, softcap: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C prompt kernel, every way the host takes its products, and the AVX2-only build's softmax."""
    kernel = cpu_prefill.load() if build == "native" else _build_without_avx512()
    if kernel is None or (dots == 1 and not kernel.has_dot_products) or (dots == 2 and not kernel.has_amx):
        pytest.skip("this build of the prefill kernel does not run here")
    monkeypatch.setattr(kernel, "dot_products", dots)
    batch = _batch(([37, 16, 50, 2], [37, 100, 53, 40]), dtype, block_size=16, hd=64)
    want = _reference_then_poison(batch, window, softcap)
    starts = batch.query_start_loc[:-1].long()
    lens = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).long()
    out = torch.empty_like(batch.query)
    kernel(out, batch.query, batch.key_cache, batch.value_cache, starts, lens, batch.seq_lens.long() - lens,
           batch.block_tables.long(), batch.scale, window=window, softcap=softcap)
    assert_close_to_reference(out, want, dtype)


# The interpreter is slow: every setting once in float32, both together with split-K and in bfloat16.
TRITON_CASES = [(w, c, torch.float32, 1) for w, c in SETTINGS] + [(13, 5.0, torch.float32, 3),
                                                                  (13, 5.0, torch.bfloat16, 1)]


@pytest.mark.parametrize(("window", "softcap", "dtype", "num_splits"), TRITON_CASES,
                         ids=[f"window{w}-softcap{c:g}-{str(d)[6:]}-splits{n}" for w, c, d, n in TRITON_CASES])
def test_triton_kernel_matches_reference(window: int, softcap: float, dtype: torch.dtype, num_splits: int) -> None:
    """Triton (TRITON_INTERPRET=1, tests/kernels/conftest.py): one launch for a mixed batch, with split-K."""
    from pageserve_kernels.paged_attention import paged_attention

    batch = _batch(([1, 20, 1, 9], [70, 45, 130, 9]), dtype, block_size=16, n_q=4)
    want = _reference_then_poison(batch, window, softcap)
    out = paged_attention(*batch.args(), window, softcap, num_splits=num_splits)
    assert_close_to_reference(out, want, dtype)


@pytest.mark.parametrize(("window", "softcap", "arg"), [(-1, 0.0, "window"), (0, -1.0, "softcap"),
                                                        (0, math.nan, "softcap"), (2.5, 0.0, "window")])
def test_bad_window_or_softcap_is_refused_by_name(window: int, softcap: float, arg: str) -> None:
    from pageserve_kernels.paged_attention import paged_attention

    batch = _batch(([1], [4]), torch.float32)
    for fn in (paged_attention, ca.paged_attention, select_backend("torch").paged_attention):
        with pytest.raises(KernelArgError, match=f"^{arg}: ") as err:
            fn(*batch.args(), window, softcap)
        assert err.value.arg == arg


def test_windowed_and_capped_layers_warm_up_binaries_of_their_own() -> None:
    """A window or a soft-cap is a compile key of the Triton kernel only as "has one" (its value is a runtime
    argument): the warm-up compiles each kind a model names, and a window of any length runs one binary."""
    from pageserve_kernels.warmup import attention_variant_of, warmup_variants

    meta = torch.device("meta")
    kc = torch.empty(64, 16, 2, 64, dtype=torch.bfloat16, device=meta)
    plain = set(warmup_variants(kc, kc, 6, 512))
    kinds = set(warmup_variants(kc, kc, 6, 512, kinds=((0, 0.0), (4096, 0.0), (0, 50.0), (4096, 50.0))))
    assert plain < kinds and len(kinds) == 4 * len(plain)
    query = torch.empty(3, 6, 64, dtype=torch.bfloat16, device=meta)
    tables = torch.empty(3, 40, dtype=torch.int32, device=meta)
    windows = {attention_variant_of(query, kc, kc, tables, 1, 600, window=w, softcap=30.0) for w in (1, 16, 4096)}
    assert len(windows) == 1 and windows <= kinds


@pytest.mark.parametrize("adapter", ["torch", "torch-native", "kernel"])
def test_the_layer_adapters_pass_window_and_softcap_on(adapter: str) -> None:
    """engine/worker/layers/attention.py's PagedAttentionOp contract: K/V written, then the window and soft-cap
    applied (a step of a continued prompt, a fresh one and a decode over caches the step itself fills)."""
    from engine.worker.layers.attention import AttentionMetadata, KernelPagedAttention, TorchPagedAttention

    native = adapter == "torch-native"
    if native and cpu_decode.load() is None:
        pytest.skip("no C compiler here: the native kernels cannot be built")
    op = (KernelPagedAttention(select_backend("torch")) if adapter == "kernel"
          else TorchPagedAttention(native_decode=native))
    q_lens, seq_lens, bs, n_q, n_kv, hd = [9, 20, 1], [30, 20, 41], 16, 4, 2, 32
    tables = [[3, 5], [0, 7], [1, 2, 6]]
    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(8, bs, n_kv, hd, generator=gen)  # earlier steps' context, then this step's rows
    vc = torch.randn(8, bs, n_kv, hd, generator=gen)
    t = sum(q_lens)
    q = torch.randn(t, n_q, hd, generator=gen) * 4
    k, v = torch.randn(t, n_kv, hd, generator=gen), torch.randn(t, n_kv, hd, generator=gen)
    plan = op.plan(q_lens, seq_lens, tables, bs, torch.device("cpu"))
    slots = torch.tensor(compute_slot_mapping(q_lens, seq_lens, tables, bs))
    meta = AttentionMetadata(slots, torch.tensor([0, 9, 29, 30], dtype=torch.int32),
                             torch.tensor(seq_lens, dtype=torch.int32), torch.tensor([[3, 5, 0], [0, 7, 0], [1, 2, 6]],
                             dtype=torch.int32), max(q_lens), max(seq_lens), plan)
    out = op(q, k, v, kc, vc, meta, hd**-0.5, 7, 5.0)
    want = ref.paged_attention_ref(q.double(), kc.double(), vc.double(), meta.block_tables, meta.query_start_loc,
                                   meta.seq_lens, hd**-0.5, 7, 5.0)
    assert_close_to_reference(out, want, torch.float32)
