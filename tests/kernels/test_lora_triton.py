"""The Triton LoRA shrink/expand kernels against their PyTorch references, and the GPU path of a step
(device_weights.py's slots + both kernels) against batch.py's per-group reference, interpreted on the CPU.

Shapes are odd on purpose (K = 123, N = 781, ranks 1, 8, 16): every tile has a ragged edge.
"""

from __future__ import annotations

import pytest
import torch

from engine.worker.lora.adapter import LoraAdapter, LoraSlice, ProjectionLora
from engine.worker.lora.batch import build_lora_batch
from engine.worker.lora.device_weights import GpuLoraStep, LoraSlots, plan_gpu_step
from pageserve_kernels import lora_expand as expand_module
from pageserve_kernels import lora_shrink as shrink_module
from pageserve_kernels.checks import KernelArgError, interpreting
from pageserve_kernels.lora_expand import lora_expand, lora_expand_ref
from pageserve_kernels.lora_shrink import lora_shrink, lora_shrink_ref, shrink_split_k

K, N, T = 123, 781, 37
QKV = ((0, 521), (521, 651), (651, 781))  # q, k, v output columns of a fused projection of width N
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The step's rows: an index group (not contiguous), a contiguous one, a small index one; the rest are base rows.
ROWS = {1: [0, 3, 7, 8, 9, 10, 11, 30], 2: list(range(13, 30)), 3: [1, 2, 35]}


def projection(slices: list[tuple[int, int, int]], gen: torch.Generator, dtype: torch.dtype) -> ProjectionLora:
    """A random fused-projection LoRA: (start, end, rank) per targeted slice."""
    parts, r0 = [], 0
    for start, end, r in slices:
        parts.append(LoraSlice(start, end, r0, r0 + r, (torch.randn(end - start, r, generator=gen) / r).to(dtype)))
        r0 += r
    return ProjectionLora((torch.randn(r0, K, generator=gen) / K**0.5).to(dtype), tuple(parts))


def adapters(dtype: torch.dtype) -> dict[int, LoraAdapter]:
    """Three adapters of two layers: rank 16 on q/k/v, rank 8 on q and v, rank 1 on the whole span (in
    layer 0 only: adapter 3 leaves layer 1 alone)."""
    gen = torch.Generator().manual_seed(43)
    specs = {1: [[(s, e, 16) for s, e in QKV]] * 2, 2: [[(*QKV[0], 8), (*QKV[2], 8)]] * 2, 3: [[(0, N, 1)], None]}
    out = {}
    for load_id, layers in specs.items():
        built = tuple({"qkv": projection(s, gen, dtype)} if s else {} for s in layers)
        out[load_id] = LoraAdapter(f"a{load_id}", "", load_id, max(r for s in layers if s for *_, r in s), built)
    return out


def gpu_step(loras: dict[int, LoraAdapter], rows: dict[int, list[int]] = ROWS) -> GpuLoraStep:
    return plan_gpu_step(rows, loras, LoraSlots(), torch.device("cpu"))  # the interpreter runs CPU tensors


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 2])
def test_shrink_matches_reference(dtype, split_k) -> None:
    x = torch.randn(T, K, generator=torch.Generator().manual_seed(1)).to(dtype)
    step = gpu_step(adapters(dtype))
    slots = step.weights.layers[0]["qkv"]
    rows = (step.row_indices, step.group_start, step.group_slot)
    got = lora_shrink(x, slots.a, slots.rank, *rows, step.max_rows, split_k=split_k)
    want = lora_shrink_ref(x, slots.a, slots.rank, *rows)
    assert_close(got, want, dtype)
    assert got[8:25, 16:].abs().max() == 0  # group 2 (positions 8..24): ranks 8 + 8, nothing past them
    assert got.shape == (25 + 3, 48) and got.stride(0) % 16 == 0  # one binary whatever the rank


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_width", [16, 21])  # the slots' padded B, and one whose rank tile needs a mask
def test_expand_matches_reference_and_leaves_base_rows(dtype, b_width) -> None:
    gen = torch.Generator().manual_seed(2)
    step = gpu_step(adapters(dtype))
    slots = step.weights.layers[0]["qkv"]
    rows = (step.row_indices, step.group_start, step.group_slot)
    s = torch.randn(step.row_indices.shape[0], slots.a.shape[1], generator=gen)
    b = torch.cat([slots.b, torch.zeros(*slots.b.shape[:2], b_width - 16, dtype=dtype)], dim=2)
    b[1, 651:] = float("inf")  # rows no slice of slot 1 (q and v: 521 + 130 rows) owns: never read
    out = torch.randn(T, N, generator=gen).to(dtype)
    want, before = out.clone(), out.clone()
    lora_expand(s, b, slots.slices, out, *rows, step.max_rows)
    lora_expand_ref(s, b, slots.slices, want, *rows)
    assert_close(out, want, dtype)
    base = sorted(set(range(T)) - {r for rs in ROWS.values() for r in rs})
    assert torch.equal(out[base], before[base])  # rows in no group are never written
    assert torch.equal(out[13:30, 521:651], before[13:30, 521:651])  # adapter 2 has no k slice


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_path_matches_the_cpu_reference(dtype) -> None:
    """Both layers (adapter 3 has no LoRA in layer 1) and the slot layout, against LoraBatch.add."""
    loras = adapters(dtype)
    reference = build_lora_batch([T], [0], loras, torch.device("cpu"))
    assert reference is None  # no adapter rows: nothing at all
    counts, ids = [], []
    for row in range(T):  # one chunk per row, so the groups' rows are exactly ROWS
        counts.append(1)
        ids.append(next((i for i, rs in ROWS.items() if row in rs), 0))
    reference = build_lora_batch(counts, ids, loras, torch.device("cpu"))
    assert reference is not None and reference.gpu is None  # the CPU never takes the GPU path
    step = gpu_step(loras)
    gen = torch.Generator().manual_seed(3)
    for layer in (0, 1):
        x = torch.randn(T, K, generator=gen).to(dtype)
        out = torch.randn(T, N, generator=gen).to(dtype)
        want = out.clone()
        step.add(out, x, layer, "qkv")
        reference.add(want, x, layer, "qkv")
        assert_close(out, want, dtype)
        step.add(out, x, layer, "o")  # no adapter targets it: nothing happens
        assert_close(out, want, dtype)


def test_prompt_sized_groups_span_several_row_blocks() -> None:
    """150 rows of one adapter (three 64-row blocks) beside 2 of another: the small group's extra programs
    return at once, the large one's cover every row."""
    loras = adapters(torch.float32)
    rows = {1: list(range(150)), 3: [150, 169]}
    gen = torch.Generator().manual_seed(5)
    x, out = torch.randn(170, K, generator=gen), torch.randn(170, N, generator=gen)
    want = out.clone()
    gpu_step(loras, rows).add(out, x, 0, "qkv")
    ids = [1] * 150 + [3] + [0] * 18 + [3]
    reference = build_lora_batch([1] * 170, ids, loras, torch.device("cpu"))
    assert reference is not None
    reference.add(want, x, 0, "qkv")
    assert_close(out, want, torch.float32)


def test_overlapping_slices_of_one_adapter_add_up() -> None:
    """qkv_proj and q_proj both targeted: two slices over the same q columns, both added (as batch.py does)."""
    gen = torch.Generator().manual_seed(4)
    both = {7: LoraAdapter("both", "", 7, 8, ({"qkv": projection([(0, N, 8), (*QKV[0], 4)], gen, torch.float32)},))}
    rows = {7: [2, 5, 6]}
    x, out = torch.randn(T, K, generator=gen), torch.randn(T, N, generator=gen)
    want = out.clone()
    gpu_step(both, rows).add(out, x, 0, "qkv")
    reference = build_lora_batch([1] * 7, [0, 0, 7, 0, 0, 7, 7], both, torch.device("cpu"))
    assert reference is not None
    reference.add(want, x, 0, "qkv")
    assert_close(out, want, torch.float32)


class _Counting:
    """Wraps a kernel: records each launch's grid, then launches it."""

    def __init__(self, kernel) -> None:  # type: ignore[no-untyped-def]
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        self.grids.append(grid)
        return self.kernel[grid]


def test_one_launch_covers_every_adapter(monkeypatch) -> None:
    shrink = _Counting(shrink_module._lora_shrink_kernel)
    expand = _Counting(expand_module._lora_expand_kernel)
    monkeypatch.setattr(shrink_module, "_lora_shrink_kernel", shrink)
    monkeypatch.setattr(expand_module, "_lora_expand_kernel", expand)
    loras = adapters(torch.float32)
    out = torch.zeros(T, N)
    gpu_step(loras).add(out, torch.randn(T, K), 0, "qkv")
    assert len(shrink.grids) == len(expand.grids) == 1  # three adapters, two launches in all
    assert shrink.grids[0][2] == expand.grids[0][2] == 3  # one grid slice per adapter group
    for rows in ROWS.values():  # every group got its term, the base rows none
        assert bool((out[rows].abs().sum(1) > 0).all())
    base = sorted(set(range(T)) - {r for rs in ROWS.values() for r in rs})
    assert out[base].abs().sum() == 0


def test_slots_restack_only_when_the_set_changes() -> None:
    loras = adapters(torch.float32)
    slots = LoraSlots()
    first = plan_gpu_step({1: [0], 3: [1]}, loras, slots, torch.device("cpu"))
    again = plan_gpu_step({3: [4, 5], 1: [2]}, loras, slots, torch.device("cpu"))  # same set, other order
    assert again.weights is first.weights and slots.stacks == 1
    assert again.group_slot.tolist() == [0, 1] and again.row_indices.tolist() == [2, 4, 5]  # by load id
    assert again.group_start.tolist() == [0, 1, 3]
    for t in (again.row_indices, again.group_start, again.group_slot):  # one binary: all 16-byte aligned
        assert (t.data_ptr() - again.row_indices.data_ptr()) % 16 == 0
    other = plan_gpu_step({2: [0]}, loras, slots, torch.device("cpu"))
    assert other.weights is not first.weights and slots.stacks == 2
    alone = plan_gpu_step({3: [0]}, loras, LoraSlots(), torch.device("cpu")).weights.layers[0]["qkv"].slices
    assert alone.shape == (1, 3, 5) and alone[0, 1:].abs().sum() == 0  # one slice, padded to 3: one binary
    assert first.weights.layers[1]["qkv"].rank.tolist() == [48, 0]  # q, k, v at 16 each; adapter 3 leaves layer 1 alone


def test_split_k_is_a_few_powers_of_two() -> None:
    """Each split count is a binary Triton compiles: decode steps get powers of two, prompt chunks none."""
    splits = {shrink_split_k(rows, groups, 4096, 64) for rows in range(1, 300) for groups in range(1, 17)}
    assert splits == {1, 2, 4, 8, 16}
    assert shrink_split_k(1, 1, 4096, 64) == 16 and shrink_split_k(2048, 4, 4096, 64) == 1
    assert shrink_split_k(1, 1, 100, 64) == 2  # never more splits than K has blocks


def _launch_args():  # type: ignore[no-untyped-def]
    step = gpu_step(adapters(torch.float32))
    slots = step.weights.layers[0]["qkv"]
    return step, slots, (step.row_indices, step.group_start, step.group_slot)


@pytest.mark.parametrize("case, arg", [
    ("x_width", "a"), ("x_dtype", "a"), ("strided_x", "x"), ("rank_len", "slot_rank"), ("starts", "group_start"),
])
def test_shrink_rejects_bad_arguments(case, arg) -> None:
    step, slots, rows = _launch_args()
    x, a, rank = torch.randn(T, K), slots.a, slots.rank
    starts = rows[1]
    if case == "x_width":
        x = torch.randn(T, K + 1)
    elif case == "x_dtype":
        x = x.half()
    elif case == "strided_x":
        x = torch.randn(K, T).T
    elif case == "rank_len":
        rank = rank[:-1]
    else:
        starts = starts[:-1]
    with pytest.raises(KernelArgError) as info:
        lora_shrink(x, a, rank, rows[0], starts, rows[2], step.max_rows)
    assert info.value.arg == arg


@pytest.mark.parametrize("case, arg", [("s_dtype", "s"), ("s_rows", "s"), ("b_dtype", "b"), ("slices", "slices")])
def test_expand_rejects_bad_arguments(case, arg) -> None:
    step, slots, rows = _launch_args()
    s, b, table = torch.zeros(rows[0].shape[0], slots.a.shape[1]), slots.b, slots.slices
    if case == "s_dtype":
        s = s.half()
    elif case == "s_rows":
        s = s[1:]
    elif case == "b_dtype":
        b = b.half()
    else:
        table = table.long()
    with pytest.raises(KernelArgError) as info:
        lora_expand(s, b, table, torch.zeros(T, N), *rows, step.max_rows)
    assert info.value.arg == arg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_path_compiled(dtype) -> None:
    """On a CUDA device, compiled: the step through both kernels against LoraBatch's reference on the CPU."""
    if not torch.cuda.is_available() or interpreting():
        pytest.fail("gpu tests need CUDA and TRITON_INTERPRET=0")
    loras = adapters(dtype)
    cuda = {i: LoraAdapter(a.name, "", i, a.rank, tuple(
        {p: ProjectionLora(v.a.cuda(), tuple(LoraSlice(s.start, s.end, s.r0, s.r1, s.b.cuda()) for s in v.slices))
         for p, v in layer.items()} for layer in a.layers)) for i, a in loras.items()}
    ids = [next((i for i, rs in ROWS.items() if row in rs), 0) for row in range(T)]
    batch = build_lora_batch([1] * T, ids, cuda, torch.device("cuda"))
    reference = build_lora_batch([1] * T, ids, loras, torch.device("cpu"))
    assert batch is not None and batch.gpu is not None and reference is not None
    x, out = torch.randn(T, K).to(dtype), torch.randn(T, N).to(dtype)
    want = out.clone()
    got = out.cuda()
    batch.add(got, x.cuda(), 0, "qkv")
    reference.add(want, x, 0, "qkv")
    assert_close(got.cpu(), want, dtype)
