"""What every architecture's config reader shares: the Llama numbers, rotary in both config styles,
and refusing a knob the decoder does not implement by naming its key.

Both styles of config.json are read: the Hub's (`rope_theta`, `rope_scaling`, top-level
`partial_rotary_factor`) and transformers 5's (`rope_parameters` holding theta, the scaling
fields and, for Gemma 3, one dict per layer type; `layer_types`).
"""

from __future__ import annotations

from typing import Any

from engine.worker.models.spec import ModelConfigError, RopeSpec

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
LLAMA_LAYER = {
    "input_norm.weight": ("input_layernorm.weight",),
    "pre_mlp_norm.weight": ("post_attention_layernorm.weight",),
    "attn.qkv_weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn.o_weight": ("self_attn.o_proj.weight",),
    "mlp.gate_up_weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.down_weight": ("mlp.down_proj.weight",),
}
"""The Llama checkpoint's names for our DecoderLayer's parameters (architectures add or rename)."""
QKV_BIAS = {"attn.qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")}
QK_NORM = {"attn.q_norm": ("self_attn.q_norm.weight",), "attn.k_norm": ("self_attn.k_norm.weight",)}


def refuse(cfg: dict[str, Any], key: str, allowed: tuple[Any, ...], why: str = "") -> None:
    """A ModelConfigError naming `key` unless its value (absent reads as None) is one of `allowed`."""
    value = cfg.get(key)
    if value not in allowed:
        tail = f" ({why})" if why else ""
        raise ModelConfigError(f"config.json: {key}={value!r} is not supported by pageserve{tail}")


def numbers(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Llama-family numbers every decoder has, as ModelSpec's keyword arguments."""
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ModelConfigError(f"config.json: num_attention_heads={heads} is not a multiple of "
                               f"num_key_value_heads={kv_heads}")
    rope = rope_spec(cfg, int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads))
    return {
        "architecture": str(cfg.get("model_type") or "llama"),
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg.get("intermediate_size") or 0),
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope.theta,
        "rope_scaling": rope.scaling,
        "rotary_dim": rope.rotary_dim,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "attention_bias": False,
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
    }


def rope_spec(cfg: dict[str, Any], head_dim: int, params: dict[str, Any] | None = None,
              default_theta: float = 10000.0) -> RopeSpec:
    """One rotary table from either config style; `params`: a per-layer-type rope_parameters entry."""
    rope = params if params is not None else (cfg.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or default_theta)
    scaling = cfg.get("rope_scaling") if params is None else None
    if not scaling and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ModelConfigError(f"config.json: rope_scaling.rope_type={kind!r} is not supported by pageserve "
                               f"(supported: {', '.join(ROPE_TYPES)})")
    if kind == "default":
        scaling = None
    factor = float(rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ModelConfigError(f"config.json: partial_rotary_factor={factor} gives {rotary_dim} rotary channels "
                               f"of head_dim {head_dim} (an even number up to head_dim is needed)")
    return RopeSpec(theta, dict(scaling) if scaling else None, 0 if rotary_dim == head_dim else rotary_dim)


def common_refusals(cfg: dict[str, Any], act_key: str = "hidden_act", acts: tuple[str, ...] = ("silu",)) -> None:
    """Knobs that no reader implements unless it says so."""
    refuse(cfg, "mlp_bias", (None, False))
    act = cfg.get(act_key) or cfg.get("hidden_act") or acts[0]
    if act not in acts:
        raise ModelConfigError(f"config.json: {act_key}={act!r} is not supported by pageserve for "
                               f"{cfg.get('model_type')!r} (supported: {', '.join(acts)})")
    refuse(cfg, "use_bidirectional_attention", (None, False), "decoder-only causal attention")


def windows_from_layer_types(cfg: dict[str, Any], layers: int, window: int | None) -> tuple[int, ...]:
    """Per-layer windows from `layer_types` (sliding_attention / full_attention)."""
    types = cfg.get("layer_types")
    if types is None:
        return ()
    if len(types) != layers:
        raise ModelConfigError(f"config.json: layer_types has {len(types)} entries for {layers} layers")
    unknown = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
    if unknown:
        raise ModelConfigError(f"config.json: layer_types {unknown} are not supported by pageserve")
    if any(t == "sliding_attention" for t in types) and not window:
        raise ModelConfigError("config.json: layer_types has sliding_attention layers but sliding_window is unset")
    windows = tuple(int(window or 0) if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()  # every layer full: the spec says so with no windows at all
