"""The real checkpoints' shapes `pageserve bench make-model` writes: each one's config.json from the Hub.

Each entry is that checkpoint's config.json as published (architecture numbers, rope,
tying, bias and sliding-window flags, token ids, torch_dtype), written out as a literal
so a benchmark's shape is reviewable and never downloaded. make_model.py overrides only
what a random-weight folder must: the bos/eos ids become SmolLM2's (its tokenizer is
the one copied in), and `--layers` / `--set` when asked (then it is no real shape).

Source checkpoints are the instruct ones, the ones people serve; their tensor shapes
are those of the base checkpoints (Qwen2.5's base configs differ in max_window_layers,
an unused flag while use_sliding_window is false, and Llama 3.2's in eos ids only).

The mixture of experts: no official checkpoint of a type our engine will run (mixtral,
qwen2_moe, qwen3_moe) fits 24 GiB of RAM in bfloat16 (Qwen1.5-MoE-A2.7B is 14.3 B
parameters, 28.6 GB; Qwen3-30B-A3B 30.5 B; Mixtral-8x7B 46.7 B; the small real MoE
checkpoints are other types: OLMoE is olmoe, granite-3.1-1b-a400m granitemoe,
Phi-mini-MoE phimoe). So `qwen3-moe-30b-a3b-4layers` is Qwen3-30B-A3B's config with
4 of its 48 layers: every layer is the real one (128 experts, 8 active, 768 wide,
32/4 heads), about 6.2 GB in bfloat16 (12.4 GB once loaded in float32). Qwen3-MoE is
the MoE that vLLM's CPU build runs and that people serve today. Per token it does the
real work of 4 layers, so its tokens/s is not Qwen3-30B-A3B's: the name says so.
This module holds data only.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

_LLAMA_3_2_ROPE = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}

_LLAMA_3_2_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": _LLAMA_3_2_ROPE, "rope_theta": 500000.0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}

_QWEN2_5_COMMON: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 32768,
    "max_window_layers": 21, "model_type": "qwen2", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

_QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def _shape(source: str, config: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType({"source": source, "config": config})


SHAPES: dict[str, MappingProxyType[str, Any]] = {
    "llama-3.2-1b": _shape("meta-llama/Llama-3.2-1B-Instruct", {
        **_LLAMA_3_2_COMMON, "head_dim": 64, "hidden_size": 2048, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8}),
    "llama-3.2-3b": _shape("meta-llama/Llama-3.2-3B-Instruct", {
        **_LLAMA_3_2_COMMON, "head_dim": 128, "hidden_size": 3072, "intermediate_size": 8192,
        "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8}),
    "qwen2.5-0.5b": _shape("Qwen/Qwen2.5-0.5B-Instruct", {
        **_QWEN2_5_COMMON, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2}),
    "qwen2.5-1.5b": _shape("Qwen/Qwen2.5-1.5B-Instruct", {
        **_QWEN2_5_COMMON, "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
        "num_hidden_layers": 28, "num_key_value_heads": 2}),
    "qwen3-0.6b": _shape("Qwen/Qwen3-0.6B", {
        **_QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8}),
    "qwen3-1.7b": _shape("Qwen/Qwen3-1.7B", {
        **_QWEN3_COMMON, "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8}),
    "qwen3-moe-30b-a3b-4layers": _shape("Qwen/Qwen3-30B-A3B (4 of its 48 layers)", {
        **_QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "decoder_sparse_step": 1, "hidden_size": 2048, "intermediate_size": 6144, "max_window_layers": 48,
        "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 4, "num_key_value_heads": 4,
        "output_router_logits": False, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False}),
}
"""Shape name -> {"source": the Hub checkpoint, "config": its config.json}."""
