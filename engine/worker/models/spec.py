"""The one record of a model's architecture: its numbers and every option the decoder varies by.

    config.json ─ architectures/<family>.py (a config reader and a weight-name map) ─> ModelSpec
                                                                                   └> WeightNames
    ModelSpec ─> decoder.py (each option acts at one line, named after it), the KV cache's size,
                 tensor parallelism's split, the C++ layer loop's "is this a plain Llama" test

Every option has the value that makes it a no-op for a plain Llama, so a Llama config reads
into the defaults. Options are facts of the checkpoint, never of the host or the request.
This module imports torch only for dtype sizes; it knows nothing about weights or devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch


class ModelConfigError(ValueError):
    """config.json describes a model this implementation cannot run (the message names the key)."""


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: base, scaling (None or a dict with `rope_type` default/linear/llama3/longrope)
    and how many of head_dim's channels rotate (Phi-3's partial rotary; the rest pass through)."""

    theta: float = 10000.0
    scaling: dict[str, Any] | None = None
    rotary_dim: int = 0
    """0: all of head_dim."""


@dataclass(frozen=True)
class MoeOptions:
    """One model's mixture-of-experts numbers, the same in every sparse layer (engine/worker/layers/moe.py;
    read by engine/worker/models/moe_weights.py)."""

    num_experts: int
    top_k: int
    """Experts each token is sent to (`num_experts_per_tok`)."""
    norm_topk_prob: bool
    """Renormalise the top-k softmax weights to sum to 1 (Mixtral always does)."""
    expert_intermediate_size: int
    shared_expert_intermediate_size: int | None
    """Qwen2-MoE's always-on expert, scaled by sigmoid(shared_expert_gate(x)); None elsewhere."""
    round_routing_weights: bool
    """The top-k weights rounded to the model dtype before scaling (Qwen); Mixtral scales in float32."""

    def flops_per_token(self, hidden_size: int) -> int:
        """Matmul FLOPs of one token through a sparse layer: the router, its top_k experts, the shared
        expert and its gate."""
        h, shared = hidden_size, self.shared_expert_intermediate_size
        active = h * self.num_experts + self.top_k * 3 * h * self.expert_intermediate_size
        return 2 * (active + (0 if shared is None else 3 * h * shared + h))


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers of one decoder-only model (from its config.json) and its options."""

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
    """Biases on the q, k and v projections (Qwen2's, or Llama's attention_bias)."""
    max_position_embeddings: int
    architecture: str = "llama"
    """config.json's model_type, for messages and logs."""
    # -- attention --
    o_bias: bool = False
    """A bias on the output projection too (Llama's attention_bias sets both)."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)."""
    attn_scale: float = 0.0
    """Scores are q.k * attn_scale; 0: head_dim ** -0.5 (Gemma's query_pre_attn_scalar, Granite's
    attention_multiplier set it)."""
    attn_softcap: float = 0.0
    """Scores become softcap * tanh(scores / softcap) (Gemma 2's attn_logit_softcapping); 0: none."""
    layer_windows: tuple[int, ...] = ()
    """Per layer, the sliding window in tokens (a query sees the last `window` positions, itself
    included); 0 or an empty tuple: full causal attention."""
    rotary_dim: int = 0
    """Channels of each head that rotate (Phi-3's partial_rotary_factor); 0: all."""
    local_rope: RopeSpec | None = None
    """Gemma 3's sliding layers rotate by their own base (rope_local_base_freq) and no scaling."""
    # -- norms and MLP --
    norm_plus_one: bool = False
    """Gemma's RMSNorm multiplies by (1 + weight): the loader stores 1 + weight, so one kernel serves."""
    sandwich_norms: bool = False
    """Gemma 2/3: the attention and MLP outputs are normed again before their residual adds."""
    activation: Literal["silu", "gelu_tanh"] = "silu"
    """The gated MLP's activation: SwiGLU, or Gemma's GELU (tanh approximation)."""
    moe: MoeOptions | None = None
    sparse_layers: tuple[bool, ...] = ()
    """Per layer, whether its MLP is the mixture of experts (Qwen-MoE's mlp_only_layers and
    decoder_sparse_step); empty: every layer when `moe` is set."""
    # -- scales around the body --
    embed_scale: float = 1.0
    """Embeddings times this (Gemma: sqrt(hidden_size) rounded to the model dtype; Granite's
    embedding_multiplier)."""
    residual_scale: float = 1.0
    """Each block's output times this before its residual add (Granite's residual_multiplier)."""
    logits_divisor: float = 1.0
    """Logits divided by this (Granite's logits_scaling)."""
    final_softcap: float = 0.0
    """Logits become cap * tanh(logits / cap) (Gemma 2's final_logit_softcapping); 0: none."""

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    def attention_kinds(self) -> tuple[tuple[int, float], ...]:
        """The distinct (window, softcap) pairs the layers attend with: the Triton variants to compile."""
        return tuple(sorted({(self.window(i), self.attn_softcap) for i in range(self.num_layers)}))

    def is_sparse(self, layer: int) -> bool:
        if self.moe is None:
            return False
        return self.sparse_layers[layer] if self.sparse_layers else True

    @property
    def runs_in_cpp_layers(self) -> bool:
        """The C++ layer loop (engine/worker/native_layers.py) mirrors exactly this model: every option at its
        Llama value but the two it implements, q/k/v biases (Qwen2) and q/k norms (Qwen3)."""
        plain = ModelSpec(**{f: getattr(self, f) for f in _NUMBERS}, qk_norm=self.qk_norm)
        return self == plain

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize

    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the body (attention scores excluded, no logits; for a
        mixture of experts, the experts a token is routed to)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = 2 * (self.hidden_size * (q + 2 * kv) + q * self.hidden_size)
        dense = 2 * 3 * self.hidden_size * self.intermediate_size
        return sum(attn + (self.moe.flops_per_token(self.hidden_size) if self.moe and self.is_sparse(i) else dense)
                   for i in range(self.num_layers))


_NUMBERS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias",
            "max_position_embeddings", "architecture")


@dataclass(frozen=True)
class WeightNames:
    """Where each of our parameters lies in the checkpoint. Per layer, our parameter's path in
    DecoderLayer -> the checkpoint names under `model.layers.N.`, concatenated along rows when
    several (q, k, v into one fused projection; gate and up into one)."""

    layer: dict[str, tuple[str, ...]]
    embed: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    layers_prefix: str = "model.layers."
    moe_style: str = ""
    """The mixture of experts' checkpoint naming (engine/worker/models/moe_weights.py); '' for none."""
    renamed_prefixes: tuple[tuple[str, str], ...] = ()
    """(what a checkpoint may say, what the names above say): another saver's layout of the same tensors
    (transformers 5 saves Gemma 3's language model under `model.language_model.`)."""
    unused_prefixes: tuple[str, ...] = ()
    """Tensors that are not the language model's (Gemma 3's vision tower): read past, never loaded."""

    def canonical(self, name: str) -> str:
        for theirs, ours in self.renamed_prefixes:
            if name.startswith(theirs):
                return ours + name[len(theirs):]
        return name
