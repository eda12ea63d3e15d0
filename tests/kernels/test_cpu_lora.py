"""pageserve_kernels/cpu_lora.py's shrink/expand kernels against the PyTorch products of
engine/worker/lora/batch.py (`LoraBatch.reference`, the definition): odd widths, ranks 1-64, fused
projections with several slices, groups of contiguous rows and of scattered rows, base rows untouched,
and a row's term independent of the rows beside it. Each dtype's variant is skipped only where this
host cannot build it (float32: AVX2 + FMA; bfloat16: AVX-512 BW + BF16)."""

from __future__ import annotations

import pytest
import torch

from engine.worker.lora.adapter import LoraAdapter, LoraSlice, ProjectionLora, kernel_table
from engine.worker.lora.batch import LoraBatch, build_lora_batch
from pageserve_kernels import cpu_lora

DTYPES = [torch.float32, torch.bfloat16]
CPU = torch.device("cpu")


def needs(dtype: torch.dtype) -> None:
    if cpu_lora.load(dtype) is None:
        pytest.skip(f"no {dtype} LoRA kernel on this host (instructions or C compiler)")


def adapter(k: int, slices: list[tuple[int, int, int]], dtype: torch.dtype, seed: int,
            projection: str = "qkv") -> LoraAdapter:
    """A one-layer adapter on `projection`: per (start, end, rank) a slice of random A and B."""
    g = torch.Generator().manual_seed(seed)
    parts, built, r0 = [], [], 0
    for start, end, r in slices:
        parts.append(torch.randn(r, k, generator=g) / k**0.5)
        b = torch.randn(end - start, r, generator=g).to(dtype)
        built.append(LoraSlice(start, end, r0, r0 + r, b, cpu_lora.pack_b(b)))
        r0 += r
    a = torch.cat(parts).to(dtype).contiguous()
    layers = ({projection: ProjectionLora(a, tuple(built), cpu_lora.pack_a(a))},)
    return LoraAdapter(f"a{seed}", "", seed + 1, max(r for *_, r in slices), layers, kernel_table(layers))


def both(batch: LoraBatch, out: torch.Tensor, x: torch.Tensor, projection: str = "qkv") -> tuple[torch.Tensor, ...]:
    """(the kernel's result, the reference's), each from its own copy of out."""
    assert batch.kernel is not None  # every adapter had its table and the kernel loaded
    got, want = out.clone(), out.clone()
    batch.add(got, x, 0, projection)
    batch.reference(want, x, 0, projection)
    return got, want


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: the same sums in another order; bfloat16: s and the result each rounded once (PyTorch rounds
    the expand's product and the sum separately), so a few units of bfloat16's last place."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [1, 8, 16, 64])
@pytest.mark.parametrize(("k", "widths"), [(37, (70, 23, 23)), (576, (576, 192, 192)), (130, (33,)),
                                           (1536, (576,))])
def test_groups_of_slices_and_scattered_rows_match_pytorch(dtype: torch.dtype, rank: int, k: int,
                                                           widths: tuple[int, ...]) -> None:
    """Four adapters of different ranks (the last one on the first slice only) in a step of 29 rows: chunks
    of 1-9 rows, two adapters' rows scattered among others' (index rows), one contiguous (slice rows)."""
    needs(dtype)
    starts = [sum(widths[:i]) for i in range(len(widths))]
    full = [(s, s + w, rank + i) for i, (s, w) in enumerate(zip(starts, widths, strict=True))]
    adapters = {1: adapter(k, full, dtype, 1), 2: adapter(k, full[::-1], dtype, 2),
                3: adapter(k, [(0, widths[0], max(1, rank // 2))], dtype, 3), 4: adapter(k, full[:1], dtype, 4)}
    counts, ids = [3, 1, 9, 2, 1, 5, 4, 1, 3], [1, 0, 2, 1, 3, 0, 1, 4, 2]
    batch = build_lora_batch(counts, ids, adapters, CPU)
    assert batch is not None and isinstance(batch.groups[2].rows, slice) and torch.is_tensor(batch.groups[0].rows)
    g = torch.Generator().manual_seed(rank * k)
    x, out = torch.randn(sum(counts), k, generator=g).to(dtype), torch.randn(sum(counts), sum(widths), generator=g)
    got, want = both(batch, out.to(dtype), x)
    close(got, want, dtype)
    base = torch.tensor([i for i, b in enumerate(sum(([b] * n for n, b in zip(counts, ids, strict=True)), []))
                         if b == 0])
    assert torch.equal(got[base], out.to(dtype)[base])  # rows of the base model: not a bit changed
    assert not torch.equal(got, out.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_term_does_not_depend_on_its_neighbours(dtype: torch.dtype) -> None:
    """The same row alone in its step and among 40 others of its adapter: bit-equal results (the sums' order is
    fixed by K and r, not by the tile a row lands in)."""
    needs(dtype)
    a = adapter(200, [(0, 100, 16), (100, 140, 16)], dtype, 7)
    g = torch.Generator().manual_seed(3)
    x, out = torch.randn(41, 200, generator=g).to(dtype), torch.randn(41, 140, generator=g).to(dtype)
    many = build_lora_batch([41], [1], {1: a}, CPU)
    alone = build_lora_batch([1], [1], {1: a}, CPU)
    assert many is not None and alone is not None
    got_many, _ = both(many, out, x)
    for row in (0, 5, 13, 40):
        got_alone, _ = both(alone, out[row : row + 1], x[row : row + 1])
        assert torch.equal(got_alone[0], got_many[row]), row


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_projection_the_adapter_leaves_alone_is_untouched(dtype: torch.dtype) -> None:
    needs(dtype)
    batch = build_lora_batch([4], [1], {1: adapter(64, [(0, 64, 8)], dtype, 1, projection="down")}, CPU)
    assert batch is not None
    x, out = torch.randn(4, 64).to(dtype), torch.randn(4, 96).to(dtype)
    got, want = both(batch, out, x, "gate_up")
    assert torch.equal(got, out) and torch.equal(want, out)
    got, want = both(batch, out[:, :64].contiguous(), x, "down")
    close(got, want, dtype)
    assert not torch.equal(got, out[:, :64])


def test_a_step_runs_the_reference_where_an_adapter_has_no_table() -> None:
    """Adapters loaded where the kernel does not run (no table): the batch keeps PyTorch's products."""
    a = adapter(32, [(0, 32, 4)], torch.float32, 1)
    plain = LoraAdapter(a.name, a.path, a.load_id, a.rank, a.layers)  # its layers keep packed forms: no matter
    batch = build_lora_batch([2], [1], {1: plain}, CPU)
    assert batch is not None and batch.kernel is None and batch.table is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_table_entries_name_the_tensors_the_adapter_keeps(dtype: torch.dtype) -> None:
    a = adapter(40, [(0, 50, 3), (50, 90, 5)], dtype, 1)
    lora = a.layers[0]["qkv"]
    assert a.table is not None and a.table.shape == (1, len(cpu_lora.PROJECTIONS), cpu_lora.ENTRY)
    e = a.table[0, cpu_lora.PROJECTIONS.index("qkv")].tolist()
    assert e[:5] == [0, 0, lora.a_packed.data_ptr(), 8, 2]  # type: ignore[union-attr]
    assert e[5:15] == [0, 50, 0, 3, lora.slices[0].panels.data_ptr(), 50, 90, 3, 8,  # type: ignore[union-attr]
                       lora.slices[1].panels.data_ptr()]  # type: ignore[union-attr]
    assert not a.table[0, cpu_lora.PROJECTIONS.index("o")].any()
