"""Gemma 2 and Gemma 3 (`gemma2`, `gemma3_text`, and the text part of `gemma3` checkpoints).

What differs from Llama, each a ModelSpec option: embeddings times sqrt(hidden) (rounded to the
model dtype, as transformers does), (1 + w) RMSNorm, four norms per layer (the attention and MLP
outputs normed before their residual adds), GELU-tanh, scores scaled by query_pre_attn_scalar,
attention and final-logit soft-capping (Gemma 2), per-layer sliding windows from `layer_types`
or the pattern (Gemma 2 alternates; Gemma 3 slides 5 of every 6), and for Gemma 3 q/k norms and a
separate rotary base (no scaling) on its sliding layers.
"""

from __future__ import annotations

from typing import Any

from engine.worker.models.architectures.common import (
    LLAMA_LAYER,
    QK_NORM,
    common_refusals,
    numbers,
    refuse,
    rope_spec,
    windows_from_layer_types,
)
from engine.worker.models.spec import ModelSpec, RopeSpec, WeightNames

GEMMA_LAYER = LLAMA_LAYER | {
    "attn_out_norm.weight": ("post_attention_layernorm.weight",),
    "pre_mlp_norm.weight": ("pre_feedforward_layernorm.weight",),
    "mlp_out_norm.weight": ("post_feedforward_layernorm.weight",),
}


def read_gemma(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    names = WeightNames(dict(GEMMA_LAYER))
    if cfg.get("model_type") == "gemma3":  # the multimodal checkpoint: its language model's part only
        # the top level decides tying for the multimodal model (transformers' Gemma3Config: True by default)
        cfg = {**cfg["text_config"], "model_type": "gemma3_text",
               "tie_word_embeddings": cfg.get("tie_word_embeddings", True)}
        names = WeightNames(dict(GEMMA_LAYER), embed="language_model.model.embed_tokens.weight",
                            final_norm="language_model.model.norm.weight", lm_head="language_model.lm_head.weight",
                            layers_prefix="language_model.model.layers.",
                            renamed_prefixes=(("model.language_model.", "language_model.model."),
                                              ("lm_head.", "language_model.lm_head.")),
                            unused_prefixes=("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                             "model.multi_modal_projector."))
    gemma3 = cfg.get("model_type") == "gemma3_text"
    common_refusals(cfg, "hidden_activation", ("gelu_pytorch_tanh",))
    refuse(cfg, "attention_bias", (None, False))
    base = numbers(cfg)
    layers, window = base["num_layers"], int(cfg.get("sliding_window") or 0)
    windows = windows_from_layer_types(cfg, layers, window) or _pattern(cfg, layers, window, 6 if gemma3 else 2)
    spec = ModelSpec(
        **base | _gemma3_global_rope(cfg, base["head_dim"]) if gemma3 else base,
        norm_plus_one=True, sandwich_norms=True, activation="gelu_tanh",
        embed_scale=base["hidden_size"] ** 0.5,
        attn_scale=float(cfg.get("query_pre_attn_scalar") or base["head_dim"]) ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        layer_windows=windows, qk_norm=gemma3,
        local_rope=_gemma3_local_rope(cfg, base["head_dim"]) if gemma3 else None,
    )
    if gemma3:
        names.layer.update(QK_NORM)
    return spec, names


def _pattern(cfg: dict[str, Any], layers: int, window: int, default: int) -> tuple[int, ...]:
    """Older configs without layer_types: every `pattern`-th layer attends fully, the rest slide."""
    pattern = int(cfg.get("sliding_window_pattern") or default)
    return tuple(window if (i + 1) % pattern else 0 for i in range(layers)) if window else ()


def _gemma3_global_rope(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    params = (cfg.get("rope_parameters") or {}).get("full_attention")
    rope = rope_spec(cfg, head_dim, params, default_theta=1_000_000.0)
    return {"rope_theta": rope.theta, "rope_scaling": rope.scaling}


def _gemma3_local_rope(cfg: dict[str, Any], head_dim: int) -> RopeSpec:
    params = (cfg.get("rope_parameters") or {}).get("sliding_attention")
    if params is not None:
        return rope_spec(cfg, head_dim, params, default_theta=10_000.0)
    return RopeSpec(float(cfg.get("rope_local_base_freq") or 10_000.0))
