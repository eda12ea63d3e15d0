"""RMSNorm (Llama's): x / rms(x) * weight, statistics in float32, optionally fused with the residual add.

Its input is the float32 residual stream; its output is in the model dtype (the weight's)."""

from __future__ import annotations

import torch
from torch import nn

from pageserve_kernels.fused_ops import fused_add_rms_norm, rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        return rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x), both (T, H): the first in the model dtype, the second
        float32 as `residual` is; x and residual may be overwritten."""
        return fused_add_rms_norm(x, residual, self.weight, self.eps)
