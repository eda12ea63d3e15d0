"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up fused into one product, read once."""

from __future__ import annotations

import torch
from torch import nn

from engine.worker.layers.linear import Packed, linear, pack_in_place
from pageserve_kernels.fused_ops import silu_and_mul


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_weight = nn.Parameter(
            torch.empty(2 * intermediate_size, hidden_size, dtype=dtype), requires_grad=False
        )
        self.down_weight = nn.Parameter(torch.empty(hidden_size, intermediate_size, dtype=dtype), requires_grad=False)
        self.gate_up_packed: Packed | None = None
        self.down_packed: Packed | None = None

    def pack_weights(self) -> None:
        self.gate_up_packed, self.down_packed = pack_in_place(self.gate_up_weight), pack_in_place(self.down_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        gate_up = linear(x, self.gate_up_weight, self.gate_up_packed)  # (T, 2 I)
        return linear(silu_and_mul(gate_up), self.down_weight, self.down_packed)  # (T, I) -> (T, H)
