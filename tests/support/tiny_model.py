"""Test helpers that build real (tiny) models: the same loading path as production, in milliseconds.

`tiny_llama_folder(path)` writes a randomly initialised Hugging Face Llama, and
`tiny_folder(architecture, path)` one of any supported architecture (ARCHITECTURES), each built by
transformers from its own config class with every parameter perturbed (1-D weights and biases too;
Gemma's norms around 0, since it scales by 1 + w) and each architecture's knobs set to values the
tests reach: windows shorter than the prompts, head_dim unlike hidden/heads, soft-caps that bite,
partial rotary with LongRoPE factors. Not imported by the engine itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

BASE = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 12},
    "qwen2": {"use_sliding_window": True, "sliding_window": 10, "max_window_layers": 1},
    "qwen3": {"head_dim": 24, "tie_word_embeddings": False},
    "granite": {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2,
                "logits_scaling": 4.0},
    "gemma2": {"head_dim": 16, "tie_word_embeddings": False, "query_pre_attn_scalar": 24, "sliding_window": 8,
               "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
               "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {"head_dim": 16, "tie_word_embeddings": False, "query_pre_attn_scalar": 24, "sliding_window": 8,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}},
    "phi3": {"partial_rotary_factor": 0.5, "max_position_embeddings": 1024, "sliding_window": None,
             "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "original_max_position_embeddings": 128,
                                 "short_factor": [1.0 + 0.1 * i for i in range(4)],
                                 "long_factor": [2.0 + 0.5 * i for i in range(4)]}},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48, "sliding_window": None},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                  "shared_expert_intermediate_size": 96, "norm_topk_prob": False, "mlp_only_layers": [1]},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "head_dim": 24,
                  "norm_topk_prob": True, "mlp_only_layers": [0]},
}
"""Per architecture, the knobs its tiny model sets beyond BASE."""


def tiny_folder(architecture: str, path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Save a random `architecture` model (a key of ARCHITECTURES, or any model_type with overrides)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    kwargs = {**BASE, **ARCHITECTURES.get(architecture, {}), **overrides}
    config = AutoConfig.for_model(architecture, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    perturb(model, norms_around_zero=architecture.startswith("gemma"))
    model.save_pretrained(path)
    return path


def perturb(model: torch.nn.Module, *, norms_around_zero: bool = False) -> None:
    """Random init is small (std 0.02) and leaves norms at 1 and biases at 0: widen every parameter so
    logits are far from ties, greedy is stable, and a dropped bias or norm changes the tokens."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.normal_(0.0 if norms_around_zero else 1.0, 0.2)
            else:
                p.normal_(0.0, 0.2)


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
    """Save a random-weight LlamaForCausalLM to `path` and return it (2-D weights perturbed only, as
    the tests written against it expect)."""
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


def tiny_gemma3_multimodal_folder(path: str | Path, *, seed: int = 0) -> Path:
    """A Gemma 3 checkpoint as the Hub ships the 4B+ sizes: `gemma3` (Gemma3ForConditionalGeneration) with a
    tiny vision tower beside the language model, whose text part pageserve serves."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    path = Path(path)
    text = {**BASE, **ARCHITECTURES["gemma3_text"], "model_type": "gemma3_text"}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=500, boi_token_index=501, eoi_token_index=502)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config)
    perturb(model, norms_around_zero=True)
    model.save_pretrained(path)
    return path
