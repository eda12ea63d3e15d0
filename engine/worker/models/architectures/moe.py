"""Mixtral, Qwen2-MoE and Qwen3-MoE: their attention is Llama's / Qwen2's / Qwen3's, their MLP a sparse
mixture of experts in the layers `sparse_layers` names (engine/worker/models/moe_weights.py reads the
experts' numbers and tensor names; engine/worker/layers/moe.py computes them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.worker.models.architectures.llama import read_llama
from engine.worker.models.architectures.qwen import read_qwen2, read_qwen3
from engine.worker.models.moe_weights import moe_options, sparse_layers
from engine.worker.models.spec import ModelSpec, WeightNames

ATTENTION_OF = {"mixtral": ("mistral", read_llama), "qwen2_moe": ("qwen2", read_qwen2),
                "qwen3_moe": ("qwen3", read_qwen3)}
"""Each MoE family's dense twin: its attention, norms and rotary read the same way."""


def read_moe(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    kind = str(cfg["model_type"])
    twin, read = ATTENTION_OF[kind]
    options, sparse = moe_options(cfg), sparse_layers(cfg)
    dense_cfg = {**cfg, "model_type": twin, "intermediate_size": cfg.get("intermediate_size") or 0}
    spec, names = read(dense_cfg)
    spec = dataclasses.replace(spec, architecture=kind, moe=options, sparse_layers=sparse)
    return spec, dataclasses.replace(names, moe_style=kind)
