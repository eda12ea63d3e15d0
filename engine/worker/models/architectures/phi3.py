"""Phi-3, Phi-3.5 and Phi-4-mini (`phi3`): fused qkv_proj and gate_up_proj, partial rotary, LongRoPE.

LongRoPE keeps two sets of per-channel factors: short (trained context) and long. transformers
switches per forward call (long once any position passes original_max_position_embeddings), so a
cached prefix would have been rotated by the other set; pageserve follows vLLM's rule instead and
decides once at start: the long factors iff the served context (max_model_len) exceeds
original_max_position_embeddings (engine/worker/layers/rotary.py). Below that length both rules
rotate identically.
"""

from __future__ import annotations

import math
from typing import Any

from engine.worker.models.architectures.common import common_refusals, numbers, refuse
from engine.worker.models.spec import ModelConfigError, ModelSpec, WeightNames

PHI3_LAYER = {
    "input_norm.weight": ("input_layernorm.weight",),
    "pre_mlp_norm.weight": ("post_attention_layernorm.weight",),
    "attn.qkv_weight": ("self_attn.qkv_proj.weight",),
    "attn.o_weight": ("self_attn.o_proj.weight",),
    "mlp.gate_up_weight": ("mlp.gate_up_proj.weight",),  # gate rows first, then up: our fused order
    "mlp.down_weight": ("mlp.down_proj.weight",),
}


def read_phi3(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    common_refusals(cfg)
    refuse(cfg, "attention_bias", (None, False))
    base = numbers(cfg)
    scaling = base["rope_scaling"]
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "longrope":
        base["rope_scaling"] = _longrope(cfg, scaling, base["max_position_embeddings"])
    window = int(cfg.get("sliding_window") or 0)
    windows = (window,) * base["num_layers"] if window else ()
    return ModelSpec(**base, layer_windows=windows), WeightNames(dict(PHI3_LAYER))


def _longrope(cfg: dict[str, Any], scaling: dict[str, Any], max_positions: int) -> dict[str, Any]:
    original = int(scaling.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                   or 0)
    if not original:
        raise ModelConfigError("config.json: longrope scaling needs original_max_position_embeddings")
    factor = float(scaling.get("factor") or max_positions / original)  # transformers' rule
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", "short_factor": list(scaling["short_factor"]),
            "long_factor": list(scaling["long_factor"]), "original_max_position_embeddings": original,
            "attention_factor": float(attention)}
