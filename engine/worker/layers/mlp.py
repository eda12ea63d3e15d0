"""Gated feed-forward: down(act(gate(x)) * up(x)), gate and up fused into one product, read once.

The activation is the architecture's: SiLU (SwiGLU: Llama, Qwen, Phi-3, Granite) or GELU with
the tanh approximation (Gemma's GeGLU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.layers.linear import Packed, linear, pack_in_place
from engine.worker.lora.batch import LoraBatch
from pageserve_kernels.fused_ops import silu_and_mul


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, activation: str = "silu",
                 layer: int = 0) -> None:
        super().__init__()
        self.intermediate_size, self.activation = intermediate_size, activation
        self.layer = layer  # which of a LoRA adapter's layers applies here
        self.gate_up_weight = nn.Parameter(
            torch.empty(2 * intermediate_size, hidden_size, dtype=dtype), requires_grad=False
        )
        self.down_weight = nn.Parameter(torch.empty(hidden_size, intermediate_size, dtype=dtype), requires_grad=False)
        self.gate_up_packed: Packed | None = None
        self.down_packed: Packed | None = None

    def projection_weights(self) -> list[torch.Tensor]:
        """The weights pack_weights packs."""
        return [self.gate_up_weight, self.down_weight]

    def pack_weights(self, one_copy: bool = False) -> None:
        self.gate_up_packed = pack_in_place(self.gate_up_weight, one_copy)
        self.down_packed = pack_in_place(self.down_weight, one_copy)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:  # (T, H) -> (T, H)
        gate_up = linear(x, self.gate_up_weight, self.gate_up_packed)  # (T, 2 I)
        if lora is not None:  # adapter rows: + x A^T B^T on their gate/up slices
            lora.add(gate_up, x, self.layer, "gate_up")
        if self.activation == "gelu_tanh":
            gate, up = gate_up.chunk(2, dim=-1)
            h = F.gelu(gate, approximate="tanh") * up  # (T, I)
        else:
            h = silu_and_mul(gate_up)  # (T, I)
        out = linear(h, self.down_weight, self.down_packed)  # (T, H)
        if lora is not None:
            lora.add(out, h, self.layer, "down")
        return out
