"""The one decoder every supported architecture runs, read top to bottom.

    token ids (T,) ─ embed (x embed_scale) ─> x (T, H)
    for each layer:   x = x + attn(norm(x))        attention reads/writes the paged KV cache
                      x = x + mlp(norm(x))         a gated MLP, or a mixture of experts
    sampled rows only: logits = lm_head(norm(x[rows]))   (N, V): the vocab product is the
                                                         costliest shape, never run per prompt token
What the architectures change is a named option of ModelSpec (engine/worker/models/spec.py),
read once from config.json (engine/worker/models/architectures/), and acts at the line that
names it: q/k biases, q/k norms, windows and soft-caps (in Attention), the activation (GatedMLP),
Gemma's sandwich norms, Granite's residual scale, the embedding and logit scales (here).
LoRA adapters (engine/worker/lora/) reach the projections as the step's `lora` batch: each of
qkv, o, gate_up and down adds its adapter rows' x A^T B^T; None (no adapter row) costs nothing.
Each residual add is fused into the norm that follows it (vLLM's pattern): a
layer takes and returns (h, residual), where the stream above is x = h + residual,
and `RMSNorm.add_norm` does residual += h; h = norm(residual) in one pass.
The residual stream is float32 whatever the model dtype; h, the weights and the KV cache
are in the model dtype (pageserve_kernels/fused_reference.py: one rounding per op, which
keeps a bfloat16 model's greedy tokens closer to the float32 model's).
The batch is flat: T tokens of many requests, positions given per token; which
rows belong to which request is the attention metadata's business. The model
also owns its cost arithmetic (`ModelSpec.kv_bytes_per_token`, `flops_per_token`).
It knows nothing about requests, scheduling, sampling or tokenizers.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import GiB
from engine.worker.layers.attention import Attention, AttentionMetadata, PagedAttentionOp
from engine.worker.layers.exact_logits import exact_near_max
from engine.worker.layers.linear import Packed, linear, pack, second_copy_bytes
from engine.worker.layers.mlp import GatedMLP
from engine.worker.layers.moe import SparseMoE
from engine.worker.layers.norm import RMSNorm
from engine.worker.layers.rotary import RotaryEmbedding
from engine.worker.lora.batch import LoraBatch
from engine.worker.models.spec import ModelSpec

log = logging.getLogger("pageserve.engine")


class DecoderLayer(nn.Module):
    def __init__(self, s: ModelSpec, index: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype)
        self.attn = Attention(s, index, dtype)
        self.pre_mlp_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype)
        self.mlp: nn.Module = (SparseMoE.from_options(s.moe, s.hidden_size, dtype) if s.moe and s.is_sparse(index)
                               else GatedMLP(s.hidden_size, s.intermediate_size, dtype, s.activation, index))
        # sandwich_norms (Gemma 2/3): each block's output normed again before its residual add
        self.attn_out_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype) if s.sandwich_norms else None
        self.mlp_out_norm = RMSNorm(s.hidden_size, s.rms_norm_eps, dtype) if s.sandwich_norms else None
        self.residual_scale = s.residual_scale  # Granite's residual_multiplier; 1.0 elsewhere

    def forward(self, h, residual, cos, sin_signed, kv_cache, meta, paged_attention, lora=None):  # type: ignore[no-untyped-def]
        """(h, residual) -> (h, residual), each (T, H), residual float32; None in the first layer (h is then x).
        `lora`: the step's adapter rows (engine/worker/lora/batch.py), None when it has none."""
        # Submodules are called through .forward, not nn.Module.__call__ (hooks, which nothing here
        # registers): 30 layers x 3 calls a step, ~1 us each, are a share of a small batch's step.
        if residual is None:
            residual = h.float()  # h itself for a float32 model: the norm below writes a new tensor
            h = self.input_norm.forward(residual)
        else:
            h, residual = self.input_norm.add_norm(h, residual)
        h = self.attn.forward(h, cos, sin_signed, kv_cache, meta, paged_attention, lora)
        h, residual = self.pre_mlp_norm.add_norm(self._block_output(h, self.attn_out_norm), residual)
        h = self.mlp.forward(h) if lora is None else self.mlp.forward(h, lora)  # a sparse MLP never has a LoRA
        return self._block_output(h, self.mlp_out_norm), residual

    def _block_output(self, h: torch.Tensor, out_norm: RMSNorm | None) -> torch.Tensor:
        """A block's output as it joins the residual stream: Gemma's extra norm, Granite's scale."""
        if out_norm is not None:
            h = out_norm.forward(h)
        return h if self.residual_scale == 1.0 else h * self.residual_scale


class DecoderModel(nn.Module):
    def __init__(self, shape: ModelSpec, dtype: torch.dtype, max_position: int) -> None:
        super().__init__()
        self.shape, self.dtype = shape, dtype
        self.embed = nn.Parameter(torch.empty(shape.vocab_size, shape.hidden_size, dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(shape, i, dtype) for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps, dtype)
        # Tied models share the embedding matrix (the loader points lm_head at it).
        self.lm_head = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
        self.lm_head_packed: Packed | None = None
        rotary_dim = shape.rotary_dim or shape.head_dim
        self.rotary = RotaryEmbedding(rotary_dim, max_position, shape.rope_theta, shape.rope_scaling)
        local = shape.local_rope  # Gemma 3's sliding layers turn by their own base
        self.local_rotary = None if local is None else RotaryEmbedding(rotary_dim, max_position, local.theta,
                                                                       local.scaling)
        self.rotary_of_layer = [self.local_rotary is not None and shape.window(i) > 0 for i in range(shape.num_layers)]
        """Per layer: True where it takes local_rotary's angles, False where rotary's."""

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer: (num_blocks, block_size, n_kv, hd) x2
        meta: AttentionMetadata,
        paged_attention: PagedAttentionOp,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:  # (T, H) float32, before the final norm
        h, residual = self.embed_tokens(input_ids), None  # (T, H)
        if self.shape.embed_scale != 1.0:  # Gemma's sqrt(H), rounded to the model dtype as transformers does
            h = h * torch.tensor(self.shape.embed_scale, dtype=h.dtype)
        angles = [self.rotary.lookup(positions)]  # (T, 1, rotary dim) cos and sin, shared by every layer
        if self.local_rotary is not None:
            angles.append(self.local_rotary.lookup(positions))
        for layer, kv_cache, local in zip(self.layers, kv_caches, self.rotary_of_layer, strict=True):
            cos, sin_signed = angles[local]
            h, residual = layer.forward(h, residual, cos, sin_signed, kv_cache, meta, paged_attention, lora)
        return h.float() if residual is None else residual + h

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, H)
        """The embedding lookup (a tensor-parallel model overrides it: engine/worker/parallel/layers.py)."""
        return F.embedding(input_ids, self.embed)

    def pack_weights(self, spare_bytes: int | None = None) -> None:
        """Prepack every projection once the weights are loaded and moved (engine/worker/layers/linear.py).

        lm_head too: its packed copy is extra memory for a tied model (one more embedding
        matrix), but the vocab product is the costliest shape and runs every step.
        Second packed copies (a faster layout for some row counts) only where they all fit in
        `spare_bytes` (None: no limit); else every weight on one layout. The same for every layer:
        the C++ layer loop (engine/worker/native_layers.py) runs layer 0's plan for all of them.
        """
        weights = [w for layer in self.layers for w in (*layer.attn.projection_weights(),
                                                        *layer.mlp.projection_weights())] + [self.lm_head]
        extra = sum(second_copy_bytes(w) for w in weights)
        one_copy = spare_bytes is not None and extra > spare_bytes
        if one_copy:
            log.warning("weights packed on one layout each: the second copies that run some row counts faster "
                        "need %.2f GiB, and %.2f GiB is free beside the KV pools and the steps' headroom (decode "
                        "steps of a few streams may run up to ~1.8x slower: a smaller --kv-cache-memory or "
                        "--swap-space leaves room for them)", extra / GiB, max(spare_bytes, 0) / GiB)
        for layer in self.layers:
            layer.attn.pack_weights(one_copy)
            layer.mlp.pack_weights(one_copy)
        self.lm_head_packed = pack(self.lm_head, one_copy)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, H) float32 sampled rows -> (N, V) float32
        normed = self.norm(hidden)
        logits = linear(normed, self.lm_head, self.lm_head_packed)
        logits = exact_near_max(logits, normed, self.lm_head)  # a tie of the rounded product broken exactly
        if self.shape.logits_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.shape.logits_divisor
        if self.shape.final_softcap:  # Gemma 2's final_logit_softcapping
            logits = torch.tanh(logits / self.shape.final_softcap) * self.shape.final_softcap
        return logits
