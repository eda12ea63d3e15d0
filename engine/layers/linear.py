"""Linear products with oneDNN-prepacked weights for float32 on the CPU.

MKL's sgemm repacks the weight matrix on every call; at decode batch sizes
(a few to 64 rows) that repacking is a large share of the product. A weight
reordered once into oneDNN's blocked layout skips it (measured 1.3-1.6x at
M = 15..64 on this CPU). Other dtypes/devices, or a torch without the op, keep
F.linear. This module knows nothing about which weights it multiplies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH_HINT = 64  # decode batches: the shape the packing is tuned for


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The prepacked form of a (N, K) weight, or None where F.linear is the better path."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
    except (RuntimeError, AttributeError):
        return None


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (T, K) -> (T, N)
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
