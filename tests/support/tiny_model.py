"""Test helpers that build real (tiny) models: the same loading path as production, in milliseconds.

`tiny_llama_folder(path)` writes a randomly initialised Hugging Face Llama
(config.json + model.safetensors) that `resolve_model(path)` accepts, so tests
of the loader, runner and engine exercise the real code on a model that runs
in a few milliseconds per step. Not imported by the engine itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def tiny_llama_folder(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 160,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
    rope_scaling: dict[str, Any] | None = None,
    eos_token_id: int = 2,
) -> Path:
    """Save a random-weight LlamaForCausalLM to `path` and return it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope = {**rope_scaling, "rope_theta": 10000.0}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rope_parameters=rope,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Random init is small (std 0.02): widen it so logits are far from ties and greedy is stable.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return path
