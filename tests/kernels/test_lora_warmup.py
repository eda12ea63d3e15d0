"""--enable-lora on CUDA compiles the LoRA shrink/expand variants at start-up (engine/worker/lora/warmup.py):
every variant a serving step can launch is among those the warm-up launched.

A "variant" is what Triton compiles a binary for: the launch's constexprs, the dtypes, and which int
arguments are multiples of 16. The kernels are swapped for recorders of that key; the warm-up runs
through the serving path, then many random serving steps do (random adapters: ranks, target subsets,
fused qkv_proj; random groups and row counts within the token budget), and each step's keys must
already be recorded. One small plan also runs the real kernels, interpreted.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
import torch

from engine.worker.lora.adapter import LoraAdapter, LoraSlice, ProjectionLora, target_layout
from engine.worker.lora.device_weights import LoraSlots, plan_gpu_step
from engine.worker.lora.warmup import lora_warmup_plan, projection_widths, run_lora_warmup
from engine.worker.models.spec import ModelSpec
from pageserve_kernels import lora_expand as expand_module
from pageserve_kernels import lora_shrink as shrink_module

TINY = ModelSpec(vocab_size=32, hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4, num_kv_heads=2,
                 head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=True,
                 attention_bias=False, max_position_embeddings=256)
SPEC = dataclasses.replace(TINY, hidden_size=1024, intermediate_size=2816, num_heads=16, num_kv_heads=4, head_dim=64)
"""Widths of a real model: K up to 2816 lets the shrink split K up to 16 ways, so groups and rows matter."""
MAX_RANK, MAX_LORAS, BUDGET, SEQS = 32, 3, 512, 8
CPU = torch.device("cpu")
SEPARATE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Recorder:
    """Stands in for a @triton.jit kernel: records each launch's binary key, computes nothing."""

    def __init__(self, name: str, keys: set[tuple[Any, ...]]) -> None:
        self.name, self.keys = name, keys

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **constexprs: Any) -> None:
            ints = tuple((a % 16 == 0, a == 1) for a in args if isinstance(a, int))
            dtypes = tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor))
            self.keys.add((self.name, tuple(sorted(constexprs.items())), ints, dtypes))
        return launch


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> set[tuple[Any, ...]]:
    found: set[tuple[Any, ...]] = set()
    monkeypatch.setattr(shrink_module, "_lora_shrink_kernel", Recorder("shrink", found))
    monkeypatch.setattr(expand_module, "_lora_expand_kernel", Recorder("expand", found))
    return found


def random_adapter(rng: random.Random, load_id: int, dtype: torch.dtype) -> LoraAdapter:
    """One rank for all its targets (PEFT's r); a random subset of them, sometimes Phi-3's fused qkv_proj."""
    rank = rng.randint(1, MAX_RANK)
    targets = [t for t in SEPARATE if rng.random() < 0.5] or ["o_proj"]
    if rng.random() < 0.2:
        targets = [t for t in targets if t not in ("q_proj", "k_proj", "v_proj")] + ["qkv_proj"]
    layout, per_projection = target_layout(SPEC), {}
    for target in targets:
        per_projection.setdefault(layout[target][0], []).append(target)
    projections = {}
    for projection, names in per_projection.items():
        k = layout[names[0]][3]
        slices = tuple(LoraSlice(layout[t][1], layout[t][2], i * rank, (i + 1) * rank,
                                 torch.zeros(layout[t][2] - layout[t][1], rank, dtype=dtype)) for i, t in enumerate(names))
        projections[projection] = ProjectionLora(torch.zeros(len(names) * rank, k, dtype=dtype), slices)
    return LoraAdapter(f"r{load_id}", "", load_id, rank, (projections,))


def serving_step(rng: random.Random, dtype: torch.dtype) -> None:
    """A step of 1..MAX_LORAS adapter groups with rows summing to at most the budget, every projection."""
    groups = rng.randint(1, MAX_LORAS)
    adapters = {i: random_adapter(rng, i, dtype) for i in range(1, groups + 1)}
    counts = [rng.choice([1, 1, 2, rng.randint(1, BUDGET)]) for _ in range(groups)]
    while sum(counts) > BUDGET:
        counts[counts.index(max(counts))] //= 2
    rows, start = {}, 0
    for i, n in zip(adapters, counts, strict=True):
        rows[i] = list(range(start, start + n))
        start += n
    step = plan_gpu_step(rows, adapters, LoraSlots(), CPU)
    for projection, (k, widths) in projection_widths(SPEC).items():
        step.add(torch.zeros(start, sum(widths), dtype=dtype), torch.zeros(start, k, dtype=dtype), 0, projection)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_variant_a_serving_step_launches_was_warmed_up(keys: set[tuple[Any, ...]], dtype: torch.dtype) -> None:
    plan = lora_warmup_plan(SPEC, MAX_RANK, MAX_LORAS, BUDGET, SEQS)
    run_lora_warmup(SPEC, plan, dtype, CPU)
    warmed = set(keys)
    keys.clear()
    rng = random.Random(5)
    for _ in range(300):
        serving_step(rng, dtype)
    missed = keys - warmed
    assert not missed, f"{len(missed)} variants would compile mid-serving, e.g. {sorted(missed)[:2]}"
    assert {dict(c)["BLOCK_M"] for _, c, _, _ in keys} == {16, 32, 64}  # the steps did reach every row tile
    assert {dict(c)["SPLIT_K"] for n, c, _, _ in keys if n == "shrink"} == {4, 8, 16}  # and split counts

def test_the_plan_is_small_and_grows_with_the_limits() -> None:
    plan = lora_warmup_plan(SPEC, MAX_RANK, MAX_LORAS, BUDGET, SEQS)
    assert len(plan) < 200
    assert {w.projection for w in plan} == {"qkv", "o", "gate_up", "down"}
    assert max(w.max_rows + w.groups - 1 for w in plan) <= BUDGET and max(w.groups for w in plan) <= MAX_LORAS
    small = lora_warmup_plan(TINY, 8, 1, 16, 1)
    assert {(w.groups, w.max_rows) for w in small} == {(1, 1)}  # one binary for every row shape
    assert {w.rank for w in small if w.projection in ("o", "down")} == {1}  # ranks 1..8: RB 16, BLOCK_R 16
    assert {w.rank * w.targets for w in small if w.projection == "qkv"} == {1, 18}  # 3 x 6 > 16: BLOCK_R 32


def test_the_warm_up_runs_the_real_kernels() -> None:
    """Interpreted: the synthetic adapters and rows the warm-up builds are valid kernel arguments."""
    run_lora_warmup(TINY, lora_warmup_plan(TINY, 8, 2, 16, 2), torch.float32, CPU)
