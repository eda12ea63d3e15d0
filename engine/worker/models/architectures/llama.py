"""Llama (2, 3, 3.x, SmolLM), Mistral (with its sliding window) and Granite (Llama with four multipliers)."""

from __future__ import annotations

from typing import Any

from engine.worker.models.architectures.common import (
    LLAMA_LAYER,
    QKV_BIAS,
    common_refusals,
    numbers,
    refuse,
)
from engine.worker.models.spec import ModelSpec, WeightNames


def read_llama(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    common_refusals(cfg)
    base = numbers(cfg)
    layer = dict(LLAMA_LAYER)
    bias = bool(cfg.get("attention_bias", False))
    if bias:  # Llama's attention_bias puts a bias on all four projections
        layer |= QKV_BIAS | {"attn.o_bias": ("self_attn.o_proj.bias",)}
    windows = _mistral_windows(cfg, base["num_layers"])
    return ModelSpec(**base | {"attention_bias": bias}, o_bias=bias, layer_windows=windows), WeightNames(layer)


def _mistral_windows(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Mistral-7B-v0.1's `sliding_window` (4096) applies to every layer; null (v0.2+) means none.
    A Llama config's `layer_types` may only say full attention everywhere."""
    if cfg.get("model_type") == "mistral":
        window = int(cfg.get("sliding_window") or 0)
        return (window,) * layers if window else ()
    types = cfg.get("layer_types")
    if types and any(t != "full_attention" for t in types):
        refuse(cfg, "layer_types", (None,), "Llama layers attend fully")
    return ()


def read_granite(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    spec, names = read_llama(cfg | {"model_type": "llama", "layer_types": None})
    return ModelSpec(**{**spec.__dict__, "architecture": "granite",
                        "embed_scale": float(cfg.get("embedding_multiplier", 1.0)),
                        "residual_scale": float(cfg.get("residual_multiplier", 1.0)),
                        "attn_scale": float(cfg.get("attention_multiplier") or 0.0),
                        "logits_divisor": float(cfg.get("logits_scaling", 1.0))}), names
