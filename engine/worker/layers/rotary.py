"""Rotary position embedding (non-interleaved halves, as in HF Llama), with rope scaling.

cos/sin are tabulated once for every position up to max_position, in float32 as
HF computes them, and stay float32 for every model dtype (the rotation computes in float32 and
rounds once: pageserve_kernels/fused_reference.py). A step looks its positions up
once (`lookup`) and every layer reuses the result; pageserve_kernels/fused_ops.py
`rotate_qk` applies it.

Rotation of x = [x1 | x2] (two halves of head_dim):
    x * [cos | cos] + [x2 | x1] * [-sin | sin]   ==   HF's  x * cos + rotate_half(x) * sin
(negating sin instead of x2 is exact, so outputs match HF bit for bit).
"""

from __future__ import annotations

import math
from typing import Any

import torch


class RopeError(ValueError):
    """The model's rope scaling type is not supported."""


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                        max_position: int = 0) -> torch.Tensor:
    """(head_dim / 2,) float32 inverse frequencies, after the model's rope scaling (head_dim: the
    rotating channels)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    assert scaling is not None
    if kind == "longrope":  # Phi-3: per-channel factors, the long set iff the served context passes the
        # trained one (decided once, vLLM's rule: engine/worker/models/architectures/phi3.py)
        long = max_position > int(scaling["original_max_position_embeddings"])
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * theta**exponents)
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        return _llama3(inv_freq, factor, scaling)
    raise RopeError(f"rope scaling type {kind!r} is not supported (default, linear, llama3, longrope)")


def _llama3(inv_freq: torch.Tensor, factor: float, scaling: dict[str, Any]) -> torch.Tensor:
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    def __init__(
        self, head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None,
        device: torch.device | str = "cpu",
    ) -> None:
        inv_freq = inverse_frequencies(head_dim, theta, scaling, max_position)
        freqs = torch.arange(max_position, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # (P, hd/2)
        cos, sin = freqs.cos(), freqs.sin()
        attention_factor = float((scaling or {}).get("attention_factor") or 1.0)  # LongRoPE's, on cos and sin
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
        self.cos = torch.cat((cos, cos), dim=-1).to(device=device)  # (P, hd) float32
        self.sin_signed = torch.cat((-sin, sin), dim=-1).to(device=device)  # (P, hd) float32
        self.max_position = max_position

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) positions -> cos, signed sin, each (T, 1, hd) ready to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)

