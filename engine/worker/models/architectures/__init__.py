"""One config reader per architecture family: config.json -> (ModelSpec, WeightNames).

    llama.py   llama, mistral (sliding window), granite (four multipliers)
    qwen.py    qwen2 (q/k/v biases), qwen3 (q/k norms); both honour use_sliding_window
    gemma.py   gemma2, gemma3_text, gemma3 (its text part)
    phi3.py    phi3 (fused projections, partial rotary, LongRoPE)
    moe.py     mixtral, qwen2_moe, qwen3_moe (engine/worker/layers/moe.py)
    common.py  the shared numbers, rotary in both config styles, refusing a knob by its key

To add an architecture: write its reader (the options it sets, the keys it refuses) and its
weight-name map, register it below, and add it to tests/support/tiny_model.py's ARCHITECTURES so
the parity tests (tests/engine/worker/test_architectures.py) run it against transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.worker.models.architectures.gemma import read_gemma
from engine.worker.models.architectures.llama import read_granite, read_llama
from engine.worker.models.architectures.moe import read_moe
from engine.worker.models.architectures.phi3 import read_phi3
from engine.worker.models.architectures.qwen import read_qwen2, read_qwen3
from engine.worker.models.spec import ModelConfigError, ModelSpec, WeightNames

Reader = Callable[[dict[str, Any]], tuple[ModelSpec, WeightNames]]
READERS: dict[str, Reader] = {
    "llama": read_llama,
    "mistral": read_llama,
    "granite": read_granite,
    "qwen2": read_qwen2,
    "qwen3": read_qwen3,
    "gemma2": read_gemma,
    "gemma3_text": read_gemma,
    "gemma3": read_gemma,
    "phi3": read_phi3,
    "mixtral": read_moe,
    "qwen2_moe": read_moe,
    "qwen3_moe": read_moe,
}


def read_architecture(cfg: dict[str, Any]) -> tuple[ModelSpec, WeightNames]:
    """The model's spec and weight names, or a ModelConfigError naming what is not supported."""
    kind = cfg.get("model_type")
    if kind is None and "LlamaForCausalLM" in cfg.get("architectures", []):
        kind = "llama"
    reader = READERS.get(str(kind))
    if reader is None:
        raise ModelConfigError(f"config.json: model_type={kind!r} is not supported by pageserve "
                               f"(supported: {', '.join(sorted(READERS))})")
    return reader(cfg)


def read_spec(cfg: dict[str, Any]) -> ModelSpec:
    return read_architecture(cfg)[0]
