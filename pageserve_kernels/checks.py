"""Argument checks shared by the Triton launchers, and the interpreter switch.

A launcher validates everything a kernel silently trusts (shapes, dtypes, the
unit stride of the last dimension, devices) and raises `KernelArgError`, a
`ValueError`, with the argument's name. This module imports triton only lazily
so the CPU engine never pays for it.
"""

from __future__ import annotations

import math
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class KernelArgError(ValueError):
    """A kernel launcher got an argument of the wrong shape, dtype, stride or device."""

    def __init__(self, arg: str, msg: str) -> None:
        super().__init__(f"{arg}: {msg}")
        self.arg = arg


def interpreting() -> bool:
    """True when Triton kernels run in the Python interpreter (TRITON_INTERPRET=1).

    Triton reads the variable when a kernel is *decorated*, i.e. when its module
    is imported, so pageserve_kernels/dispatch.py also checks the kernel objects themselves.
    """
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_device(name: str, t: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors; the interpreter runs on CPU tensors (never CUDA ones)."""
    if t.device.type == "cuda":
        if interpreting():
            raise KernelArgError(name, "on a CUDA device with TRITON_INTERPRET=1: unset it to run compiled")
        return
    if not interpreting():
        raise KernelArgError(name, f"on {t.device}; Triton kernels need CUDA tensors or TRITON_INTERPRET=1")


def check_dim(name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dim() != ndim:
        raise KernelArgError(name, f"expected {ndim} dims, got shape {tuple(t.shape)}")


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise KernelArgError(name, f"dtype {t.dtype} not in {allowed}")


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    """The kernels vectorise along the last dimension and assume its stride is 1."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise KernelArgError(name, f"last dimension must have stride 1, strides are {t.stride()}")


def check_int_index(name: str, t: torch.Tensor, ndim: int) -> None:
    check_dim(name, t, ndim)
    check_dtype(name, t, (torch.int32, torch.int64))


def check_window_softcap(window: int, softcap: float) -> None:
    """A sliding window is a whole number of tokens, 0 for none; a soft-cap a finite value, 0 for none."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise KernelArgError("window", f"must be an int >= 0 (0: full causal attention), got {window!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise KernelArgError("softcap", f"must be a finite float >= 0 (0: no soft-capping), got {softcap!r}")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def upcast_dots(dtype: torch.dtype) -> bool:
    """Whether tl.dot operands must be widened to float32 first.

    Triton 3.9's interpreter computes bfloat16 arithmetic on the raw 16-bit
    integers (a bf16 tl.dot returns garbage), while conversions are right. On a
    GPU the tensor cores take bf16 natively, so this is only ever true there.
    """
    return interpreting() and dtype == torch.bfloat16


def exact_bf16(dtype: torch.dtype) -> bool:
    """Whether a kernel storing `dtype` must round by hand (see pageserve_kernels/bf16.py)."""
    return interpreting() and dtype == torch.bfloat16


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Everything pageserve_kernels/paged_attention.py's kernel trusts."""
    check_window_softcap(window, softcap)
    check_dim("query", query, 3)
    check_dim("key_cache", key_cache, 4)
    check_dtype("query", query, FLOAT_DTYPES)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.shape != key_cache.shape or cache.dtype != query.dtype:
            raise KernelArgError(name, f"{tuple(cache.shape)} {cache.dtype} does not match query/key_cache")
        check_last_contiguous(name, cache)
    check_last_contiguous("query", query)
    n_q, head_dim = query.shape[1], query.shape[2]
    n_kv = key_cache.shape[2]
    if key_cache.shape[3] != head_dim:
        raise KernelArgError("key_cache", f"head_dim {key_cache.shape[3]} != query head_dim {head_dim}")
    if n_q % n_kv != 0:
        raise KernelArgError("query", f"{n_q} query heads are not a multiple of {n_kv} KV heads")
    check_int_index("block_tables", block_tables, 2)
    check_int_index("query_start_loc", query_start_loc, 1)
    check_int_index("seq_lens", seq_lens, 1)
    batch = block_tables.shape[0]
    if query_start_loc.shape[0] != batch + 1 or seq_lens.shape[0] != batch:
        raise KernelArgError("query_start_loc", f"need B + 1 = {batch + 1} entries and seq_lens B")
    if block_tables.stride(1) != 1 or not query_start_loc.is_contiguous() or not seq_lens.is_contiguous():
        raise KernelArgError("block_tables", "index tensors must be contiguous along their last dim")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_device(name, t)
        if t.device != query.device:
            raise KernelArgError(name, f"on {t.device}, query on {query.device}")
    for name, t in (
        ("block_tables", block_tables),
        ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens),
    ):
        if t.device != query.device:
            raise KernelArgError(name, f"on {t.device}, query on {query.device}")
