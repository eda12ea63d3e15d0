"""Qwen2 / Qwen2.5 (q, k, v biases) and Qwen3 (per-head q/k norms, explicit head_dim).

Both honour `use_sliding_window`: layers from `max_window_layers` on attend through `sliding_window`
(transformers' rule), or `layer_types` where the config lists them.
"""

from __future__ import annotations

from typing import Any

from engine.worker.models.architectures.common import (
    LLAMA_LAYER,
    QK_NORM,
    QKV_BIAS,
    common_refusals,
    numbers,
    windows_from_layer_types,
)
from engine.worker.models.spec import ModelSpec, WeightNames


def qwen_windows(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    window = int(cfg.get("sliding_window") or 0) if cfg.get("use_sliding_window") else 0
    if cfg.get("layer_types") is not None:
        return windows_from_layer_types(cfg, layers, window)
    if not window:
        return ()
    first = int(cfg.get("max_window_layers", layers))
    windows = tuple(window if i >= first else 0 for i in range(layers))
    return windows if any(windows) else ()


def read_qwen2(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    common_refusals(cfg)
    base = numbers(cfg)
    spec = ModelSpec(**base | {"attention_bias": True}, layer_windows=qwen_windows(cfg, base["num_layers"]))
    return spec, WeightNames(LLAMA_LAYER | QKV_BIAS)


def read_qwen3(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    common_refusals(cfg)
    base = numbers(cfg)
    bias = bool(cfg.get("attention_bias", False))
    layer = LLAMA_LAYER | QK_NORM | (QKV_BIAS | {"attn.o_bias": ("self_attn.o_proj.bias",)} if bias else {})
    spec = ModelSpec(**base | {"attention_bias": bias}, o_bias=bias, qk_norm=True,
                     layer_windows=qwen_windows(cfg, base["num_layers"]))
    return spec, WeightNames(layer)
