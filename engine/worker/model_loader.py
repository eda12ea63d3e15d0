"""Weights from a Hugging Face folder into our `DecoderModel`, read straight from safetensors.

`shared.model_store.resolve_model(spec)` turns "smollm2" or a local path into a
folder holding config.json and model.safetensors (or shards with an index).
Their tensors are renamed and fused here by the architecture's weight-name map
(engine/worker/models/architectures/: q|k|v -> qkv, gate|up -> gate_up) and cast to the
engine's dtype; transformers is not involved. Every parameter of the model must be filled and
every tensor of the checkpoint used, so a misread architecture fails at start, never later.
Tied models point lm_head at the embedding matrix. This module knows nothing about KV caches
or requests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.config import CacheConfig, ModelConfig
from engine.worker.host_memory import STEP_HEADROOM, available_bytes
from engine.worker.models.architectures import read_architecture
from engine.worker.models.decoder import DecoderModel
from engine.worker.models.moe_weights import load_moe
from engine.worker.models.spec import ModelConfigError, ModelSpec, WeightNames
from pageserve_kernels.cpu_features import has_bf16_hardware, has_fast_matmul
from shared.model_store import ModelFiles, resolve_model

log = logging.getLogger("pageserve.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    model: DecoderModel
    shape: ModelSpec
    name: str
    """The served model name."""
    path: Path
    """The HF folder (tokenizer files live there too)."""
    max_model_len: int
    """min(the config's max_model_len, the model's max_position_embeddings)."""
    eos_token_id: int | None
    dtype: str
    """The dtype it runs in ("auto" resolved): "float32", "bfloat16" or "float16"."""


def resolve_dtype(dtype: str, device: str) -> str:
    """ "auto" -> bfloat16 on a GPU or on a CPU with bfloat16 hardware (AVX512-BF16 or AMX), else
    float32 (vLLM's rule: emulated bfloat16 products run several times slower than float32)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.device(device).type != "cpu" or has_bf16_hardware() else "float32"


def load_model(config: ModelConfig, shard: Callable[[DecoderModel], DecoderModel] | None = None,
               reserve_bytes: int | None = None, ranks: int = 1) -> LoadedModel:
    """`shard`: turns the loaded full model into one tensor-parallel rank's (engine/worker/parallel/),
    before the device move and the packing; `LoadedModel.shape` stays the full model's. `reserve_bytes`: memory
    the host must keep for what comes after the weights (the KV pools and the steps; None: no limit); the
    weights' second packed copies take what is left beyond it, shared by `ranks` processes loading at once."""
    files = resolve_model(config.model)
    shape, names = read_architecture(files.config)
    max_len = min(config.max_model_len or shape.max_position_embeddings, shape.max_position_embeddings)
    dtype_name = resolve_dtype(config.dtype, config.device)
    dtype = DTYPES[dtype_name]
    if torch.device(config.device).type == "cpu" and not has_fast_matmul(dtype):
        log.warning("%s products have no hardware support on this CPU (no AVX512-BF16/FP16 or AMX): they are "
                    "emulated and run several times slower than float32; --dtype float32 is faster here",
                    dtype_name)
    model = DecoderModel(shape, dtype, max_len)
    _load_weights(model, names, files, dtype)
    if shard is not None:
        model = shard(model)
    model.to(config.device)
    model.rotary.cos = model.rotary.cos.to(config.device)
    model.rotary.sin_signed = model.rotary.sin_signed.to(config.device)
    model.eval()
    model.pack_weights(_spare_bytes(reserve_bytes, ranks))  # after the move: packed layouts are device-specific
    return LoadedModel(model, shape, files.name, files.path, max_len, _eos_token_id(files), dtype_name)


def memory_reserve(cache: CacheConfig) -> int:
    """What load_model keeps free beyond the weights: both KV pools, and STEP_HEADROOM for the steps."""
    return cache.kv_cache_memory + cache.swap_space + STEP_HEADROOM


def _spare_bytes(reserve_bytes: int | None, ranks: int) -> int | None:
    """This process's share of the memory left beyond the reserve, measured now (the weights are loaded);
    None: no limit (none asked, or the host's memory cannot be read)."""
    if reserve_bytes is None or (available := available_bytes()) is None:
        return None
    return (available - reserve_bytes) // ranks


def _eos_token_id(files: ModelFiles) -> int | None:
    eos: Any = files.config.get("eos_token_id")
    gen = files.path / "generation_config.json"
    if eos is None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        return int(eos[0]) if eos else None
    return None if eos is None else int(eos)


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise ModelConfigError(f"{folder} has no model.safetensors (nor a sharded index)")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(folder / shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensors[name] = f.get_tensor(name)
    return tensors


def _load_weights(model: DecoderModel, names: WeightNames, files: ModelFiles, dtype: torch.dtype) -> None:
    w = {names.canonical(n): t for n, t in _read_tensors(files.path).items()
         if not n.startswith(names.unused_prefixes)}

    def take(name: str) -> torch.Tensor:
        """The tensor in memory of its own: the checkpoint's tensors are views of the file's mapping, and one
        kept (an embedding, a norm) kept the whole file mapped and resident (+3.3 GB RSS for Qwen3-1.7B)."""
        try:
            return w.pop(name).to(dtype, copy=True)
        except KeyError:
            raise ModelConfigError(f"{files.path}: tensor {name!r} is missing") from None

    shape = model.shape
    filled: set[str] = set()
    with torch.no_grad():
        model.embed.data = take(names.embed)
        for i, layer in enumerate(model.layers):
            prefix = f"{names.layers_prefix}{i}."
            sparse = shape.is_sparse(i)
            for ours, theirs in names.layer.items():
                if sparse and ours.startswith("mlp."):
                    continue  # the experts' tensors: load_moe below
                param = layer.get_parameter(ours)
                parts = [take(prefix + n) for n in theirs]
                param.data = parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)
                filled.add(f"{i}.{ours}")
            if sparse:
                load_moe(layer.mlp, take, prefix, names.moe_style)
                filled.update(f"{i}.mlp.{n}" for n, _ in layer.mlp.named_parameters())
        model.norm.weight.data = take(names.final_norm)
        if shape.tie_word_embeddings:
            w.pop(names.lm_head, None)
            model.lm_head = model.embed  # tied: one matrix, two uses
        else:
            model.lm_head.data = take(names.lm_head)
        if shape.norm_plus_one:  # Gemma's norms scale by (1 + weight): stored so, one RMSNorm kernel serves
            for name, param in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith("_norm"):
                    param.data = (param.data.float() + 1.0).to(dtype)
    unfilled = [n for n, _ in model.layers.named_parameters() if n not in filled]
    if unfilled:
        raise ModelConfigError(f"{files.path}: no checkpoint tensor for {unfilled[:5]} (a wrong weight-name map?)")
    leftover = [n for n in w if not n.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise ModelConfigError(f"{files.path}: unexpected tensors {leftover[:5]} (not a {shape.architecture} "
                               "model, or a part pageserve does not implement)")
