"""Mixtral, Qwen2-MoE and Qwen3-MoE: Llama/Qwen attention with a sparse mixture-of-experts MLP."""

from __future__ import annotations

from typing import Any

from engine.worker.models.spec import ModelConfigError, ModelSpec, WeightNames


def read_moe(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    raise ModelConfigError(f"config.json: model_type={cfg.get('model_type')!r} (mixture of experts) is not "
                           "supported by pageserve yet")
