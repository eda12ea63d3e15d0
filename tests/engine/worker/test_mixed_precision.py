"""A bfloat16 model keeps its residual stream and rotary tables in float32 and rounds each op's output once
(pageserve_kernels/fused_reference.py), on the C path and on the PyTorch path alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm import LLM
from engine.worker.models.decoder import DecoderLayer
from pageserve_kernels import cpu_fused_bf16
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import random_prompts, tiny_model

__all__ = ["tiny_model"]


def _run_recording_layers(folder: Path, monkeypatch: pytest.MonkeyPatch
                          ) -> tuple[list[tuple[torch.dtype, torch.dtype]], torch.dtype]:
    """(h, residual) dtypes out of every decoder layer call, and the dtype of the rotary tables. The model
    calls its layers' forward directly (no nn.Module hooks), so the method itself is wrapped. Eager: the
    Python layers on every step (the C++ ones equal them bit for bit: tests/engine/worker/test_native_layers.py)."""
    llm = LLM(str(folder), "bfloat16", num_device_blocks=32, num_cpu_blocks=0, block_size=4, enforce_eager=True)
    model = llm.core.runner.model
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    forward = DecoderLayer.forward

    def record(layer: DecoderLayer, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = forward(layer, *args)
        seen.append((out[0].dtype, out[1].dtype))
        return out

    monkeypatch.setattr(DecoderLayer, "forward", record)
    llm.generate(random_prompts([9, 3], 512), SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                 detokenize=False)
    return seen, model.rotary.cos.dtype


@pytest.mark.parametrize("native", [True, False], ids=["c-kernels", "pytorch"])
def test_bfloat16_layers_carry_a_float32_residual_stream(tiny_model: Path, native: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(cpu_fused_bf16, "load", lambda: None)
    seen, table_dtype = _run_recording_layers(tiny_model, monkeypatch)
    assert seen and all(h == torch.bfloat16 and residual == torch.float32 for h, residual in seen), seen
    assert table_dtype == torch.float32


def test_one_rounding_per_op_on_the_pytorch_path() -> None:
    """bfloat16 in, float32 arithmetic, one rounding out: equal to the float32 op on the same inputs, rounded."""
    from pageserve_kernels.fused_reference import rms_norm_reference, rotary_reference, silu_and_mul_reference

    g = torch.Generator().manual_seed(0)
    stream, w = torch.randn(5, 96, generator=g) * 3, torch.randn(96, generator=g).bfloat16()
    want = (stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).bfloat16()
    assert torch.equal(rms_norm_reference(stream, w, 1e-5), want)
    gate_up = (torch.randn(5, 64, generator=g) * 4).bfloat16()
    g32, u32 = gate_up[:, :32].float(), gate_up[:, 32:].float()
    assert torch.equal(silu_and_mul_reference(gate_up), (torch.nn.functional.silu(g32) * u32).bfloat16())
    qk, angles = torch.randn(5, 2, 16, generator=g).bfloat16(), torch.rand(5, 1, 8, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([-angles.sin(), angles.sin()], -1)
    x = qk.float()
    want_qk = (x * cos + torch.cat([x[..., 8:], x[..., :8]], -1) * sin).bfloat16()
    assert torch.equal(rotary_reference(qk, cos, sin), want_qk)
