"""Self-attention over the paged KV cache: QKV projection, rotary, cache write, paged attention, output.

Each step, the new tokens' K/V are written into their slots of the cache
(`AttentionMetadata.slot_mapping`), then every query attends through its
request's block table to all earlier tokens (cached by earlier steps, or
written just now). There is never a per-request contiguous cache.

Which implementation does the paging is the backend's business:
`TorchPagedAttention` (pageserve_kernels/cpu_attention.py, planned once per step) or
`KernelPagedAttention` (any `pageserve_kernels.dispatch.AttentionBackend`, e.g. Triton).
This module knows nothing about requests or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from engine.worker.layers.linear import Packed, linear, pack_in_place
from engine.worker.lora.batch import LoraBatch
from engine.worker.models.spec import ModelSpec
from pageserve_kernels import cpu_attention
from pageserve_kernels.cpu_attention import AttentionPlan
from pageserve_kernels.fused_ops import rms_norm, rotate_qk


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's flat batch as attention sees it; built once by the runner, read by every layer."""

    slot_mapping: torch.Tensor
    """(T,) int64: cache slot of each new token."""
    query_start_loc: torch.Tensor
    """(B + 1,) int32: request b owns rows query_start_loc[b] : query_start_loc[b + 1]."""
    seq_lens: torch.Tensor
    """(B,) int32: tokens of request b in the cache after this step's write."""
    block_tables: torch.Tensor
    """(B, max_blocks) int32: physical block of each logical block (padding repeats block 0)."""
    max_query_len: int
    max_seq_len: int
    plan: AttentionPlan | None = None
    """The torch backend's per-step plan (decode groups, chunks); None for kernel backends."""


class PagedAttentionOp(Protocol):
    def __call__(
        self,
        query: torch.Tensor,  # (T, n_q, hd)
        key: torch.Tensor,  # (T, n_kv, hd)
        value: torch.Tensor,  # (T, n_kv, hd)
        key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:  # (T, n_q, hd)
        """`window` > 0: each query sees its last `window` keys (itself included); `softcap` > 0: scores
        become softcap * tanh(score / softcap) before the mask (pageserve_kernels/reference.py)."""
        ...

    def plan(
        self, query_lens: list[int], seq_lens: list[int], tables: list[list[int]], block_size: int,
        device: torch.device,
    ) -> AttentionPlan | None:
        """This backend's own per-step metadata (built once per step, read by every layer)."""
        ...


class TorchPagedAttention:
    """pageserve_kernels/cpu_attention.py: the step's plan is reused by every layer."""

    def __init__(self, native_decode: bool = False, native_prompts: bool = True) -> None:
        self.native_decode = native_decode  # decodes planned for the C kernel (it loaded for this dtype)
        self.native_prompts = native_prompts
        """With native_decode, prompt chunks planned for the C prefill kernel (where it is built), not
        PyTorch's attention: the faster here for the model's shape (pageserve_kernels/prefill_choice.py)."""

    def plan(self, query_lens, seq_lens, tables, block_size, device):  # type: ignore[no-untyped-def]
        return cpu_attention.plan_attention(query_lens, seq_lens, tables, block_size, device, self.native_decode,
                                            self.native_prompts)

    def __call__(self, query, key, value, key_cache, value_cache, meta, scale, window=0,  # type: ignore[no-untyped-def]
                 softcap=0.0):
        assert meta.plan is not None, "the torch backend needs a planned step"
        cpu_attention.store_kv(key, value, key_cache, value_cache, meta.slot_mapping)
        return cpu_attention.attend(query, key_cache, value_cache, meta.plan, scale, fresh_kv=(key, value),
                                    window=window, softcap=softcap)


class KernelPagedAttention:
    """Any backend with pageserve_kernels/reference.py's signatures (pageserve_kernels.dispatch.AttentionBackend)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def plan(self, query_lens, seq_lens, tables, block_size, device):  # type: ignore[no-untyped-def]
        return None  # the kernels read block tables and lengths straight from AttentionMetadata

    def __call__(self, query, key, value, key_cache, value_cache, meta, scale, window=0,  # type: ignore[no-untyped-def]
                 softcap=0.0):
        self.backend.write_kv(key, value, key_cache, value_cache, meta.slot_mapping)
        return self.backend.paged_attention(
            query, key_cache, value_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
            window, softcap, max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
        )


class Attention(nn.Module):
    """One layer's attention; the architecture's options act at the lines named after them."""

    def __init__(self, spec: ModelSpec, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = layer  # which of a LoRA adapter's layers applies here
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.scale = spec.scale
        self.rotary_dim = spec.rotary_dim  # 0: every channel rotates
        self.eps = spec.rms_norm_eps
        self.options: dict[str, Any] = {}
        """What this layer passes the attention op beyond a plain causal layer: its sliding window and
        score soft-cap (Mistral, Qwen's upper layers, Gemma), so plain layers call the op as before."""
        if spec.window(layer):
            self.options["window"] = spec.window(layer)
        if spec.attn_softcap:
            self.options["softcap"] = spec.attn_softcap
        qkv_rows = self.q_size + 2 * self.kv_size
        hidden = spec.hidden_size
        # q, k and v projections fused into one matrix: one product instead of three.
        self.qkv_weight = nn.Parameter(torch.empty(qkv_rows, hidden, dtype=dtype), requires_grad=False)
        self.qkv_bias = _maybe(spec.attention_bias, qkv_rows, dtype, 0.0)
        self.o_weight = nn.Parameter(torch.empty(hidden, self.q_size, dtype=dtype), requires_grad=False)
        self.o_bias = _maybe(spec.o_bias, hidden, dtype, 0.0)
        self.q_norm = _maybe(spec.qk_norm, spec.head_dim, dtype, 1.0)  # per-head RMSNorm weights (Qwen3, Gemma 3)
        self.k_norm = _maybe(spec.qk_norm, spec.head_dim, dtype, 1.0)
        self.qkv_packed: Packed | None = None
        self.o_packed: Packed | None = None

    def projection_weights(self) -> list[torch.Tensor]:
        """The weights pack_weights packs."""
        return [self.qkv_weight, self.o_weight]

    def pack_weights(self, one_copy: bool = False) -> None:
        """Prepack the projections once the weights are loaded (engine/worker/layers/linear.py)."""
        self.qkv_packed, self.o_packed = pack_in_place(self.qkv_weight, one_copy), pack_in_place(self.o_weight, one_copy)

    def forward(
        self,
        x: torch.Tensor,  # (T, H)
        cos: torch.Tensor,  # (T, 1, rotary dim)
        sin_signed: torch.Tensor,  # (T, 1, rotary dim)
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # this layer's K and V pools
        meta: AttentionMetadata,
        paged_attention: PagedAttentionOp,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:  # (T, H)
        t, n_q, n_kv = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = linear(x, self.qkv_weight, self.qkv_packed, self.qkv_bias)  # (T, q_size + 2 kv_size)
        if lora is not None:  # adapter rows: + x A^T B^T on their q/k/v slices (engine/worker/lora/batch.py)
            lora.add(qkv, x, self.layer, "qkv")
        heads = qkv.view(t, n_q + 2 * n_kv, self.head_dim)  # q | k | v heads
        qk = heads[:, : n_q + n_kv]
        if self.q_norm is not None and self.k_norm is not None:  # qk_norm: each head normed before rotary
            qk = torch.cat((rms_norm(qk[:, :n_q].reshape(-1, self.head_dim), self.q_norm, self.eps).view(t, n_q, -1),
                            rms_norm(qk[:, n_q:].reshape(-1, self.head_dim), self.k_norm, self.eps).view(t, n_kv, -1)),
                           dim=1)
        if self.rotary_dim:  # partial rotary (Phi-3): the first rotary_dim channels of each head turn
            qk = qk.clone()
            qk[..., : self.rotary_dim] = rotate_qk(qk[..., : self.rotary_dim], cos, sin_signed)
        else:
            qk = rotate_qk(qk, cos, sin_signed)  # q and k rotated together (in place on the C path)
        q, k = qk.split((n_q, n_kv), dim=1)  # (T, n_q, hd), (T, n_kv, hd)
        o = paged_attention(q, k, heads[:, n_q + n_kv :], kv_cache[0], kv_cache[1], meta, self.scale,
                            **self.options)  # (T, n_q, hd)
        out = linear(o.reshape(t, self.q_size), self.o_weight, self.o_packed, self.o_bias)  # (T, H)
        if lora is not None:
            lora.add(out, o.reshape(t, self.q_size), self.layer, "o")
        return out


def _maybe(present: bool, size: int, dtype: torch.dtype, fill: float) -> nn.Parameter | None:
    """A 1-D parameter the architecture has (a bias, a norm's weight), or None where it has none."""
    return nn.Parameter(torch.full((size,), fill, dtype=dtype), requires_grad=False) if present else None
