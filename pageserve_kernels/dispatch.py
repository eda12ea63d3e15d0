"""The attention backend: which implementation of the three KV-cache kernels the engine uses.

Chosen once at engine start by `select_backend(choice, device)`:

    choice   device   backend
    "auto"   cuda     triton   (pageserve_kernels/paged_attention.py, write_kv.py, copy_blocks.py)
    "auto"   cpu      torch    (pageserve_kernels/cpu_attention.py, the fast PyTorch path)
    "triton" cpu      triton   only under TRITON_INTERPRET=1 (tests); a clear error otherwise
    "triton" cuda     triton   compiled; TRITON_INTERPRET=1 here is refused (it would silently
                               run every kernel in the Python interpreter)
    "torch"  any      torch

Every backend has the same call signatures, those of pageserve_kernels/reference.py (paged_attention's
`window` and `softcap` included: a layer's sliding window and logit soft-cap, 0 for none), with
two extensions: paged_attention takes optional keyword hints `max_query_len` and
`max_seq_len` (host ints that spare the Triton launcher a device sync; the torch
path ignores them), and copy_blocks copies in every layer at once (a list of
caches). The engine reaches copy_blocks through pageserve_kernels/block_moves.py, which
also owns the swaps. The Triton modules are imported only when chosen, so the CPU engine never
compiles or imports a kernel. This file knows nothing about models or scheduling.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from pageserve_kernels import reference
from pageserve_kernels.checks import check_window_softcap, interpreting

BackendChoice = Literal["auto", "torch", "triton"]
BACKEND_CHOICES: tuple[str, ...] = ("auto", "torch", "triton")


class BackendError(RuntimeError):
    """The requested attention backend cannot run here (bad flag, no GPU, no interpreter)."""


class PagedAttentionFn(Protocol):
    def __call__(
        self,
        query: torch.Tensor,  # (T, n_q, hd)
        key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,  # (B, max_blocks) int32
        query_start_loc: torch.Tensor,  # (B + 1,) int32
        seq_lens: torch.Tensor,  # (B,) int32
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        *,
        max_query_len: int | None = None,
        max_seq_len: int | None = None,
    ) -> torch.Tensor: ...


WriteKVFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
CopyBlocksFn = Callable[[list[torch.Tensor], torch.Tensor], None]


@dataclass(frozen=True)
class AttentionBackend:
    name: Literal["torch", "triton"]
    paged_attention: PagedAttentionFn
    write_kv: WriteKVFn
    copy_blocks: CopyBlocksFn
    """caches (K and V of every layer), (N, 2) src -> dst device block pairs."""


def select_backend(choice: str = "auto", device: torch.device | str = "cpu") -> AttentionBackend:
    """The backend for an engine whose KV cache lives on `device`."""
    if choice not in BACKEND_CHOICES:
        raise BackendError(f"attention backend {choice!r} is not one of {BACKEND_CHOICES}")
    device = torch.device(device)
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return _torch_backend()
    if device.type == "cuda" and interpreting():
        raise BackendError(
            "TRITON_INTERPRET=1 is set but the KV cache is on a CUDA device: the kernels would run "
            "in the Python interpreter; unset TRITON_INTERPRET (or set it to 0) to compile them"
        )
    if device.type != "cuda" and not interpreting():
        raise BackendError(
            f"the triton backend needs a CUDA device (KV cache on {device}); "
            "to run its kernels on the CPU set TRITON_INTERPRET=1 before starting"
        )
    return _triton_backend()


def _torch_backend() -> AttentionBackend:
    fast = _cpu_attention_module()
    paged = getattr(fast, "paged_attention", None) or reference.paged_attention_ref
    write = getattr(fast, "write_kv", None) or reference.write_kv_ref

    def paged_attention(
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        *,
        max_query_len: int | None = None,
        max_seq_len: int | None = None,
    ) -> torch.Tensor:
        check_window_softcap(window, softcap)
        return paged(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, window, softcap)

    return AttentionBackend("torch", paged_attention, write, copy_blocks_torch)


def _cpu_attention_module() -> object | None:
    """pageserve_kernels/cpu_attention.py (the model engineer's fast path) if present, else None."""
    try:
        return importlib.import_module("pageserve_kernels.cpu_attention")
    except ModuleNotFoundError as exc:
        if exc.name != "pageserve_kernels.cpu_attention":
            raise
        return None


def _triton_backend() -> AttentionBackend:
    from pageserve_kernels.copy_blocks import _copy_blocks_kernel, copy_blocks
    from pageserve_kernels.merge_splits import _merge_splits_kernel
    from pageserve_kernels.paged_attention import _paged_attention_kernel, paged_attention
    from pageserve_kernels.write_kv import _write_kv_kernel, write_kv

    if interpreting():
        from triton.runtime.interpreter import InterpretedFunction

        kernels = (_paged_attention_kernel, _merge_splits_kernel, _write_kv_kernel, _copy_blocks_kernel)
        if not all(isinstance(k, InterpretedFunction) for k in kernels):
            # Triton reads TRITON_INTERPRET when a kernel is decorated, at import.
            raise BackendError("TRITON_INTERPRET=1 was set after the kernel modules were imported")
    return AttentionBackend("triton", paged_attention, write_kv, copy_blocks)


def copy_blocks_torch(
    caches: list[torch.Tensor],  # each (num_blocks, block_size, n_kv, hd)
    src_dst: torch.Tensor,  # (N, 2) int
) -> None:
    """copy_blocks_ref without the Python loop over pairs: one gather + scatter per cache."""
    if src_dst.shape[0] == 0:
        return
    idx = src_dst.to(device=caches[0].device, dtype=torch.int64)
    for cache in caches:
        cache.index_copy_(0, idx[:, 1], cache.index_select(0, idx[:, 0]))
