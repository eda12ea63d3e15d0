"""The mixture-of-experts part of Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints: config knobs and tensor names.

    moe_options(cfg)    the router and expert sizes from config.json, as a frozen MoeOptions
    sparse_layers(cfg)  which decoder layers hold a SparseMoE (the others a dense GatedMLP)
    load_moe(...)       fills one layer's SparseMoE from a checkpoint through `take(name)`

Two namings per layer prefix P (`model.layers.N.`) are read, both what the Hub holds and what
transformers 5.25 `save_pretrained` writes (by default it converts back to the first; with
save_original_format=False it keeps its in-memory 3-D tensors, the second):

    per expert (Hub)   Mixtral  P block_sparse_moe.gate.weight                      (E, H) router
                                P block_sparse_moe.experts.{e}.w1 / w3 / w2.weight   gate / up / down
                       Qwen     P mlp.gate.weight                                   (E, H) router
                                P mlp.experts.{e}.gate_proj / up_proj / down_proj.weight
    fused (3-D)        all      P mlp.gate.weight, P mlp.experts.gate_up_proj (E, 2I, H) [gate | up],
                                P mlp.experts.down_proj (E, H, I)
    shared (Qwen2-MoE) both     P mlp.shared_expert.gate_proj / up_proj / down_proj.weight,
                                P mlp.shared_expert_gate.weight (1, H)

Knobs read and deliberately ignored, each training-only in transformers 5.25: `router_jitter_noise`
(Mixtral multiplies the input by noise only `if self.training`), `output_router_logits` and
`router_aux_loss_coef` (they add the load-balancing loss and the router logits to the outputs;
the hidden states are the same). This module knows nothing about the rest of the decoder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.worker.layers.moe import SparseMoE
from engine.worker.models.spec import ModelConfigError, MoeOptions

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
Take = Callable[[str], torch.Tensor]


def _model_type(cfg: dict[str, Any]) -> str:
    kind = cfg.get("model_type")
    if kind not in MOE_TYPES:
        raise ModelConfigError(f"model_type {kind!r} has no mixture-of-experts reader (known: {', '.join(MOE_TYPES)})")
    return str(kind)


def _num_experts(cfg: dict[str, Any]) -> int:
    # Mixtral names it num_local_experts; Qwen's Hub configs num_experts, but transformers 5.25 writes
    # Qwen3-MoE's as num_local_experts (its attribute_map): read whichever is there.
    value = cfg.get("num_local_experts") if cfg.get("num_experts") is None else cfg.get("num_experts")
    if value is None:
        raise ModelConfigError("config.json gives neither num_experts nor num_local_experts")
    return int(value)


def _int(cfg: dict[str, Any], key: str) -> int:
    if cfg.get(key) is None:
        raise ModelConfigError(f"config.json of a {cfg.get('model_type')} model lacks {key!r}")
    return int(cfg[key])


def moe_options(cfg: dict[str, Any]) -> MoeOptions:
    """The MoE numbers of a mixtral / qwen2_moe / qwen3_moe config.json; ModelConfigError for what we cannot run."""
    kind = _model_type(cfg)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported in the experts (silu only)")
    num_experts, top_k = _num_experts(cfg), int(cfg.get("num_experts_per_tok", 2))
    if any(sparse_layers(cfg)) and not 1 <= top_k <= num_experts:
        raise ModelConfigError(f"num_experts_per_tok {top_k} must be between 1 and the {num_experts} experts")
    if kind == "mixtral":
        return MoeOptions(num_experts, top_k, norm_topk_prob=True,
                          expert_intermediate_size=_int(cfg, "intermediate_size"),
                          shared_expert_intermediate_size=None, round_routing_weights=False)
    shared = _int(cfg, "shared_expert_intermediate_size") if kind == "qwen2_moe" else 0  # transformers: always one
    return MoeOptions(num_experts, top_k, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                      expert_intermediate_size=_int(cfg, "moe_intermediate_size"),
                      shared_expert_intermediate_size=shared or None, round_routing_weights=True)


def sparse_layers(cfg: dict[str, Any]) -> tuple[bool, ...]:
    """Per decoder layer: does it hold a SparseMoE? Mixtral: all. Qwen MoE (as transformers' decoder layer):
    layer i iff i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    layers = _int(cfg, "num_hidden_layers")
    if _model_type(cfg) == "mixtral":
        return (True,) * layers
    step = int(cfg.get("decoder_sparse_step", 1))
    if step < 1:
        raise ModelConfigError(f"decoder_sparse_step {step} must be at least 1")
    dense_only = set(cfg.get("mlp_only_layers") or ())
    experts = _num_experts(cfg)
    return tuple(i not in dense_only and experts > 0 and (i + 1) % step == 0 for i in range(layers))


def load_moe(moe: SparseMoE, take: Take, prefix: str, model_type: str) -> None:
    """Fill `moe` from the tensors `take` pops (it raises on a missing name); `prefix` is `model.layers.N.`."""
    if model_type not in MOE_TYPES:
        raise ModelConfigError(f"model_type {model_type!r} has no mixture-of-experts weight names")
    hub = "block_sparse_moe" if model_type == "mixtral" else "mlp"
    with torch.no_grad():
        router, gate_up = _router(take, prefix, hub)
        moe.router_weight.data = _checked(router, moe.router_weight, prefix + "router")
        if gate_up is not None:
            down = take(prefix + "mlp.experts.down_proj")
        else:
            gate_up, down = _stack_experts(take, f"{prefix}{hub}.experts.", model_type, moe.num_experts)
        moe.experts_gate_up.data = _checked(gate_up, moe.experts_gate_up, prefix + "experts gate_up")
        moe.experts_down.data = _checked(down, moe.experts_down, prefix + "experts down")
        if moe.shared_intermediate_size is not None:
            p = prefix + "mlp.shared_expert."
            shared = [take(f"{p}{n}_proj.weight") for n in ("gate", "up")]
            moe.shared_gate_up.data = _checked(torch.cat(shared), moe.shared_gate_up, p + "gate_up")
            moe.shared_down.data = _checked(take(p + "down_proj.weight"), moe.shared_down, p + "down_proj")
            gate = take(prefix + "mlp.shared_expert_gate.weight")
            moe.shared_expert_gate.data = _checked(gate, moe.shared_expert_gate, prefix + "mlp.shared_expert_gate")


def _router(take: Take, prefix: str, hub: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The router weight, and the fused (E, 2I, H) gate_up where the experts are stored 3-D (else None).
    Mixtral's fused save renames its block `mlp`; Qwen's keeps `mlp`: the experts' names tell them apart."""
    if hub != "mlp":
        try:
            return take(f"{prefix}{hub}.gate.weight"), None
        except (ModelConfigError, KeyError):
            pass  # not the Hub naming: then transformers' fused one, whose router name the error below gives
    router = take(prefix + "mlp.gate.weight")
    try:
        return router, take(prefix + "mlp.experts.gate_up_proj")
    except (ModelConfigError, KeyError):
        return router, None  # per expert: a missing expert tensor is reported by its Hub name


def _stack_experts(take: Take, p: str, model_type: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up, down = ("w1", "w3", "w2") if model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    gate_up = torch.stack([torch.cat([take(f"{p}{e}.{gate}.weight"), take(f"{p}{e}.{up}.weight")]) for e in range(n)])
    return gate_up, torch.stack([take(f"{p}{e}.{down}.weight") for e in range(n)])  # (E, 2I, H), (E, H, I)


def _checked(t: torch.Tensor, into: torch.Tensor, what: str) -> torch.Tensor:
    if t.shape != into.shape:
        raise ModelConfigError(f"{what}: checkpoint shape {tuple(t.shape)} != expected {tuple(into.shape)}")
    return t.to(into.dtype).contiguous()
