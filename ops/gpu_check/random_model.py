"""A random-weight Llama folder (config.json + model.safetensors) written without transformers.

The GPU check must run on a bare GPU image: no converted SmolLM2 on disk, maybe
no transformers. Our loader reads any Llama-family HF folder, so a folder with
SmolLM2-135M's shape and random weights exercises the same code and the same
kernel shapes. Weights use std 0.2 (as tests/support/tiny_model.py does) so that logits are
far from ties and greedy tokens are a stable comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

SMOLLM2_SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192}
TINY_SHAPE = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 1024}


def write_random_llama(folder: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """Write the folder (tied embeddings, no biases) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "bos_token_id": 1, "eos_token_id": 2, **shape}
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)
    h, i = shape["hidden_size"], shape["intermediate_size"]
    hd = h // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd

    def rand(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen) * 0.2

    tensors = {"model.embed_tokens.weight": rand(shape["vocab_size"], h), "model.norm.weight": torch.ones(h)}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
        }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
