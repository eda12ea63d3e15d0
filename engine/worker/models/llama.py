"""The Llama family decoder (Llama 2/3, SmolLM, Mistral-style GQA), read top to bottom.

    token ids (T,) ─ embed ─> x (T, H)
    for each layer:   x = x + attn(norm(x))        attention reads/writes the paged KV cache
                      x = x + mlp(norm(x))
    sampled rows only: logits = lm_head(norm(x[rows]))   (N, V): the vocab product is the
                                                         costliest shape, never run per prompt token
Each residual add is fused into the norm that follows it (vLLM's pattern): a
layer takes and returns (h, residual), where the stream above is x = h + residual,
and `RMSNorm.add_norm` does residual += h; h = norm(residual) in one pass.
The residual stream is float32 whatever the model dtype; h, the weights and the KV cache
are in the model dtype (pageserve_kernels/fused_reference.py: one rounding per op, which
keeps a bfloat16 model's greedy tokens closer to the float32 model's).
The batch is flat: T tokens of many requests, positions given per token; which
rows belong to which request is the attention metadata's business. The model
also owns its cost arithmetic (`LlamaShape.kv_bytes_per_token`, `flops_per_token`).
It knows nothing about requests, scheduling, sampling or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.layers.attention import Attention, AttentionMetadata, PagedAttentionOp
from engine.worker.layers.exact_logits import exact_near_max
from engine.worker.layers.linear import Packed, linear, pack
from engine.worker.layers.mlp import GatedMLP
from engine.worker.layers.norm import RMSNorm
from engine.worker.layers.rotary import RotaryEmbedding


class ModelConfigError(ValueError):
    """config.json describes a model this implementation cannot run."""


@dataclass(frozen=True)
class LlamaShape:
    """The architecture numbers of one Llama-family model (from its config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> LlamaShape:
        if cfg.get("model_type") not in ("llama", "mistral", None) and "LlamaForCausalLM" not in cfg.get(
            "architectures", []
        ):
            raise ModelConfigError(f"model_type {cfg.get('model_type')!r} is not a Llama-family model")
        if cfg.get("mlp_bias"):
            raise ModelConfigError("mlp_bias=true is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (silu only)")
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ModelConfigError(f"{heads} attention heads are not a multiple of {kv_heads} KV heads")
        rope = cfg.get("rope_parameters") or {}  # transformers >= 5 nests theta and scaling here
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize

    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the body (attention scores excluded, no logits)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = self.hidden_size * (q + 2 * kv) + q * self.hidden_size + 3 * self.hidden_size * self.intermediate_size
        return 2 * self.num_layers * per_layer


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype)
        self.attn = Attention(s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.attention_bias, dtype)
        self.post_attn_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype)
        self.mlp = GatedMLP(s.hidden_size, s.intermediate_size, dtype)

    def forward(self, h, residual, cos, sin_signed, kv_cache, meta, paged_attention):  # type: ignore[no-untyped-def]
        """(h, residual) -> (h, residual), each (T, H), residual float32; None in the first layer (h is then x)."""
        # Submodules are called through .forward, not nn.Module.__call__ (hooks, which nothing here
        # registers): 30 layers x 3 calls a step, ~1 us each, are a share of a small batch's step.
        if residual is None:
            residual = h.float()  # h itself for a float32 model: the norm below writes a new tensor
            h = self.input_norm.forward(residual)
        else:
            h, residual = self.input_norm.add_norm(h, residual)
        h = self.attn.forward(h, cos, sin_signed, kv_cache, meta, paged_attention)
        h, residual = self.post_attn_norm.add_norm(h, residual)
        return self.mlp.forward(h), residual


class LlamaModel(nn.Module):
    def __init__(self, shape: LlamaShape, dtype: torch.dtype, max_position: int) -> None:
        super().__init__()
        self.shape, self.dtype = shape, dtype
        self.embed = nn.Parameter(torch.empty(shape.vocab_size, shape.hidden_size, dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(shape, dtype) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps, dtype)
        # Tied models share the embedding matrix (the loader points lm_head at it).
        self.lm_head = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
        self.lm_head_packed: Packed | None = None
        self.rotary = RotaryEmbedding(shape.head_dim, max_position, shape.rope_theta, shape.rope_scaling)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer: (num_blocks, block_size, n_kv, hd) x2
        meta: AttentionMetadata,
        paged_attention: PagedAttentionOp,
    ) -> torch.Tensor:  # (T, H) float32, before the final norm
        h, residual = self.embed_tokens(input_ids), None  # (T, H)
        cos, sin_signed = self.rotary.lookup(positions)  # (T, 1, hd) each, shared by every layer
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer.forward(h, residual, cos, sin_signed, kv_cache, meta, paged_attention)
        return h.float() if residual is None else residual + h

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, H)
        """The embedding lookup (a tensor-parallel model overrides it: engine/worker/parallel/layers.py)."""
        return F.embedding(input_ids, self.embed)

    def pack_weights(self) -> None:
        """Prepack every projection once the weights are loaded and moved (engine/worker/layers/linear.py).

        lm_head too: its packed copy is extra memory for a tied model (one more embedding
        matrix), but the vocab product is the costliest shape and runs every step.
        """
        for layer in self.layers:
            layer.attn.pack_weights()
            layer.mlp.pack_weights()
        self.lm_head_packed = pack(self.lm_head)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, H) float32 sampled rows -> (N, V) float32
        normed = self.norm(hidden)
        logits = linear(normed, self.lm_head, self.lm_head_packed)
        return exact_near_max(logits, normed, self.lm_head)  # a tie of the rounded product broken exactly
