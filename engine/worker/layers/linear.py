"""Linear products with weights prepacked once, for float32 on the CPU.

Three paths, picked once per weight at load time by `pack`:
  - our AVX2 GEMM over 16-column panels (pageserve_kernels/cpu_gemm.py): 1.3-1.5x oneDNN at
    decode batch sizes, even at prompt sizes, and batch-invariant;
  - oneDNN's blocked layout where that kernel cannot build (no AVX2+FMA, no C compiler,
    PAGESERVE_NATIVE_KERNELS=0): MKL's sgemm repacks the weight on every call, which
    costs 1.3-1.6x at 15-64 rows on this CPU;
  - F.linear for other dtypes and devices, or a torch without the oneDNN op.
This module knows nothing about which weights it multiplies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pageserve_kernels import cpu_gemm

BATCH_HINT = 64  # decode batches: the shape oneDNN's packing is tuned for

Packed = cpu_gemm.PanelWeight | torch.Tensor


def pack(weight: torch.Tensor) -> Packed | None:
    """The prepacked form of a (N, K) weight, or None where F.linear is the better path."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    if cpu_gemm.load() is not None:
        return cpu_gemm.pack_panels(weight)
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
    except (RuntimeError, AttributeError):
        return None


def linear(x: torch.Tensor, weight: torch.Tensor, packed: Packed | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (T, K) -> (T, N)
    if packed is None:
        return F.linear(x, weight, bias)
    if isinstance(packed, cpu_gemm.PanelWeight):
        native = cpu_gemm.load()
        assert native is not None  # a PanelWeight exists only where the kernel loaded
        return native.linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
