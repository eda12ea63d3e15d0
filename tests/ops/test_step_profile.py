"""The step profiler behind `pageserve bench offline --profile`, on a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.core import EngineCore
from engine.scheduling.config import SchedulerConfig
from ops.bench.step_profile import CATEGORIES, OTHER, categorize, format_profile, profile_steps
from tests.engine.model_fixtures import random_prompts, tiny_model

__all__ = ["tiny_model"]


def test_builtins_and_kernel_wrappers_fall_in_their_categories() -> None:
    assert categorize("<built-in method torch._C._nn.linear>") == "matmul"
    assert categorize("<built-in method torch._ops.mkldnn._linear_pointwise>") == "matmul"
    assert categorize("<built-in method torch._C._nn.scaled_dot_product_attention>") == "attention: prompts"
    assert categorize("<method 'index_copy_' of 'torch._C.TensorBase' objects>") == "KV cache writes"
    assert categorize("<built-in method torch.tensor>") == OTHER
    from pageserve_kernels import cpu_decode, cpu_fused

    assert categorize(cpu_decode.NativeDecode.__call__.__code__) == "attention: decode"
    assert categorize(cpu_fused.NativeFused.silu_and_mul.__code__) == "norms, SiLU, rotary"
    assert categorize(cpu_fused.NativeFused.argmax.__code__) == "sampling"
    from pageserve_kernels import cpu_gemm

    assert categorize(cpu_gemm.NativeGemm.linear.__code__) == "matmul"
    from pageserve_kernels import cpu_prefill

    assert categorize(cpu_prefill.NativePrefill.__call__.__code__) == "attention: prompts"


def test_profile_covers_every_step_and_counts_model_flops(tiny_model: Path) -> None:
    core = EngineCore(EngineConfig(
        model=ModelConfig(str(tiny_model)),
        cache=CacheConfig(block_size=4, num_device_blocks=64, num_cpu_blocks=0),
        scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4),
    ))
    prompts = random_prompts([5, 23, 9, 40, 2], vocab=512)
    outputs = [7, 3, 12, 5, 9]
    p = profile_steps(core, prompts, outputs)

    assert not core.has_unfinished()
    core.scheduler.check_invariants()
    # 92 prompt tokens under a 16-token budget need at least 6 steps with prompt tokens
    assert p.prompt.steps >= 6 and p.decode.steps >= 1
    shape = core.runner.model.shape
    fed = sum(len(pr) + n - 1 for pr, n in zip(prompts, outputs, strict=True))  # the last token is never fed back
    assert p.matmul_flops == fed * shape.flops_per_token() + sum(outputs) * 2 * shape.hidden_size * shape.vocab_size
    # the categories split each step's wall time, nothing more and nothing less
    names = {c for c, _ in CATEGORIES} | {OTHER}
    for kind in (p.decode, p.prompt):
        assert set(kind.by_category) <= names
        assert abs(sum(kind.by_category.values()) - kind.seconds) < 1e-6
    assert p.category("matmul") > 0 and p.category("attention: prompts") > 0
    assert p.decode.by_category.get("attention: decode", 0.0) > 0
    table = format_profile(p)
    assert "matmul" in table and "GFLOP/s" in table and f"{p.decode.steps} decode-only steps" in table
