"""Sparse mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks top_k of E SwiGLU experts per token.

    x (T, H) ─ router ─> logits (T, E) ─ softmax (float32, over all E) ─ top_k ─> (weight, expert) per (token, slot)
    pairs sorted by expert:     [e0 e0 e0 | e2 | e5 e5 | ...]      (T k pairs, experts with no pair skipped)
    each expert with pairs:     gate_up (n, 2I) ─ silu_and_mul ─ down (n, H)     its weights read once a step
    scatter back:               out[token] += weight * y      (index_add_, float32), one rounding to the model dtype
    Qwen2-MoE's shared expert:  out += sigmoid(shared_expert_gate(x)) * shared_mlp(x)

Routing follows transformers 5.25 (modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py):
the router product runs in the model dtype (F.linear, as there: the same logits, so the same routes),
the softmax in float32, renormalised over the top k iff `norm_topk_prob` (Mixtral always), and the
routing weights rounded to the model dtype where Qwen does it (`round_routing_weights`; Mixtral keeps
them float32). The expert products and the scatter run per expert, not per token: a decode batch of T
tokens reads at most min(E, T k) experts' weights once each, never T k times.
This module owns the expert compute and its parameter layout; checkpoint names live in
engine/worker/models/moe_weights.py, tensor-parallel slicing in engine/worker/parallel/moe_shard.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.layers.linear import Packed, linear, pack, pack_in_place
from engine.worker.models.spec import MoeOptions
from pageserve_kernels.fused_ops import silu_and_mul


def _frozen(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class SparseMoE(nn.Module):
    @classmethod
    def from_options(cls, options: MoeOptions, hidden_size: int, dtype: torch.dtype) -> SparseMoE:
        return cls(hidden_size, options.expert_intermediate_size, options.num_experts, options.top_k,
                   options.norm_topk_prob, dtype, options.shared_expert_intermediate_size,
                   round_routing_weights=options.round_routing_weights)

    def __init__(
        self,
        hidden_size: int,
        expert_intermediate_size: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool,
        dtype: torch.dtype,
        shared_expert_intermediate_size: int | None = None,
        *,
        round_routing_weights: bool = True,
    ) -> None:
        """`round_routing_weights`: Qwen rounds the top-k weights to the model dtype before they scale the
        experts' outputs; Mixtral (False) scales in float32."""
        super().__init__()
        assert 1 <= top_k <= num_experts, (top_k, num_experts)
        self.hidden_size, self.intermediate_size = hidden_size, expert_intermediate_size
        self.num_experts, self.top_k = num_experts, top_k
        self.norm_topk_prob, self.round_routing_weights = norm_topk_prob, round_routing_weights
        self.router_weight = _frozen(num_experts, hidden_size, dtype=dtype)  # (E, H)
        self.experts_gate_up = _frozen(num_experts, 2 * expert_intermediate_size, hidden_size, dtype=dtype)  # (E, 2I, H)
        self.experts_down = _frozen(num_experts, hidden_size, expert_intermediate_size, dtype=dtype)  # (E, H, I)
        self.shared_intermediate_size = shared_expert_intermediate_size
        if shared_expert_intermediate_size is not None:
            s = shared_expert_intermediate_size
            self.shared_gate_up = _frozen(2 * s, hidden_size, dtype=dtype)  # (2Is, H): gate rows, then up
            self.shared_down = _frozen(hidden_size, s, dtype=dtype)  # (H, Is)
            self.shared_expert_gate = _frozen(1, hidden_size, dtype=dtype)  # (1, H)
        self.gate_up_packed: list[Packed | None] | None = None
        self.down_packed: list[Packed | None] | None = None
        self.shared_packed: tuple[Packed | None, Packed | None] = (None, None)

    def projection_weights(self) -> list[torch.Tensor]:
        """The weights pack_weights packs: each expert's two, and the shared expert's."""
        experts = [w[e] for w in (self.experts_gate_up, self.experts_down) for e in range(self.num_experts)]
        shared = [self.shared_gate_up, self.shared_down] if self.shared_intermediate_size is not None else []
        return experts + shared

    def pack_weights(self, one_copy: bool = False) -> None:
        """Each expert's two products prepacked (engine/worker/layers/linear.py), as the dense MLP's: about
        2x faster at decode batches in bfloat16 (ops/bench/kernels/moe.py). Where no row bucket multiplies
        the raw weight (all experts share one plan: one shape), the 3-D parameter's elements are freed, as
        pack_in_place does: the experts' bytes once, not twice. Call once, after loading and sharding."""
        self.gate_up_packed = [pack(self.experts_gate_up[e], one_copy) for e in range(self.num_experts)]
        self.down_packed = [pack(self.experts_down[e], one_copy) for e in range(self.num_experts)]
        _free_if_unread(self.experts_gate_up, self.gate_up_packed)
        _free_if_unread(self.experts_down, self.down_packed)
        if self.shared_intermediate_size is not None:
            self.shared_packed = (pack_in_place(self.shared_gate_up, one_copy), pack_in_place(self.shared_down, one_copy))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (T, H) -> weights (T, k) f32, ids (T, k)
        logits = F.linear(x, self.router_weight)  # (T, E) in the model dtype, as transformers computes it
        probs = torch.softmax(logits.float(), dim=-1)  # (T, E) float32, over all experts
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # (T, k) each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.round_routing_weights:
            weights = weights.to(x.dtype).float()  # Qwen: `router_top_value.to(router_logits.dtype)`
        return weights, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H), model dtype
        weights, experts = self.route(x)  # (T, k) float32, (T, k) int64
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # (T, H) accumulator
        if x.shape[0]:
            self._experts_into(out, x, weights, experts)
        if self.shared_intermediate_size is not None:
            out += self._shared(x)
        return out.to(x.dtype)

    def _experts_into(self, out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> None:
        """out (T, H) float32 += each token's weighted expert outputs, computed expert by expert."""
        flat = experts.reshape(-1)  # (T k,) pair p = token p // k, slot p % k
        order = torch.argsort(flat, stable=True)  # (T k,) pairs grouped by expert
        tokens = order // self.top_k  # (T k,) the token of each grouped pair
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # pairs per expert: one host sync
        rows = x.index_select(0, tokens)  # (T k, H) each pair's input, grouped
        ys = torch.empty_like(rows)  # (T k, H) each pair's expert output, model dtype
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue  # an expert without tokens costs nothing
            part = slice(start, start + n)
            gate_up = linear(rows[part], *_expert(self.experts_gate_up, self.gate_up_packed, e))  # (n, 2I)
            ys[part] = linear(silu_and_mul(gate_up), *_expert(self.experts_down, self.down_packed, e))  # (n, H)
            start += n
        scale = weights.reshape(-1).index_select(0, order).unsqueeze(1)  # (T k, 1) float32
        out.index_add_(0, tokens, ys.float() * scale)

    def _shared(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H) float32
        gate_up_packed, down_packed = self.shared_packed
        h = linear(silu_and_mul(linear(x, self.shared_gate_up, gate_up_packed)), self.shared_down, down_packed)
        gate = torch.sigmoid(F.linear(x, self.shared_expert_gate).float())  # (T, 1)
        return gate * h.float()


def _free_if_unread(weight: nn.Parameter, plans: list[Packed | None]) -> None:
    if all(plan is not None and "torch" not in plan.impls for plan in plans):
        weight.data = weight.data.new_empty(0)  # its dtype stays (linear() checks it), its elements go


def _expert(weight: torch.Tensor, plans: list[Packed | None] | None, e: int) -> tuple[torch.Tensor, Packed | None]:
    """Expert e's (weight, plan) for linear(): after _free_if_unread the empty parameter stands in for the
    weight (only its dtype is read: every bucket multiplies the packed copy)."""
    plan = None if plans is None else plans[e]
    return (weight[e] if weight.numel() else weight), plan
