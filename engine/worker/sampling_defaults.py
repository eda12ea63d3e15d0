"""The sampling values a request gets for the fields it leaves out: decided here, once, at start-up.

    the model folder's generation_config.json   (vLLM's --generation-config auto)
      or, when it sets none, the model card's recommendation for a packaged model
    overridden key by key by the engine flag --default-sampling '{"temperature": 0.3}'

The engine announces the result in Ready (shared/protocol.py SamplingDefault); the
gateway fills every field the request did not set before it sends the request, so
a request's own values always win and the engine never guesses which were given.
Only the fields vLLM takes from generation_config.json are read: temperature, top_p,
top_k, min_p, repetition_penalty. No torch, no tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.sampling import DEFAULTABLE_FIELDS, SamplingError, SamplingParams

FIELDS = DEFAULTABLE_FIELDS
"""generation_config.json keys that become defaults (same names in SamplingParams)."""

MODEL_CARD_DEFAULTS: dict[str, dict[str, float]] = {
    # SmolLM2-Instruct's model card samples with temperature=0.2, top_p=0.9; the GGUF we convert
    # carries no generation_config values, so without this the default model samples at 1.0.
    "smollm2": {"temperature": 0.2, "top_p": 0.9},
}


class SamplingDefaultsError(ValueError):
    """--default-sampling or generation_config.json holds a value SamplingParams refuses."""


def generation_config_defaults(model_path: Path) -> dict[str, float]:
    path = model_path / "generation_config.json"
    if not path.is_file():
        return {}
    config: dict[str, Any] = json.loads(path.read_text())
    return {k: config[k] for k in FIELDS if isinstance(config.get(k), int | float) and not isinstance(config[k], bool)}


def resolve_sampling_defaults(model_path: Path, model_name: str, flag: str | None) -> dict[str, float]:
    """The defaults to announce; raises SamplingDefaultsError naming the bad key."""
    defaults = generation_config_defaults(model_path) or dict(MODEL_CARD_DEFAULTS.get(model_name, {}))
    if flag:
        try:
            overrides = json.loads(flag)
        except json.JSONDecodeError as e:
            raise SamplingDefaultsError(f"--default-sampling is not JSON: {e}") from None
        if not isinstance(overrides, dict):
            raise SamplingDefaultsError("--default-sampling must be a JSON object such as '{\"temperature\": 0.7}'")
        unknown = sorted(set(overrides) - set(FIELDS))
        if unknown:
            raise SamplingDefaultsError(f"--default-sampling: unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
        defaults.update(overrides)
    return check_defaults(defaults)


def check_defaults(defaults: dict[str, Any]) -> dict[str, float]:
    for name, value in defaults.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise SamplingDefaultsError(f"default {name} must be a number, got {value!r}")
    if "top_k" in defaults:
        if defaults["top_k"] != int(defaults["top_k"]):
            raise SamplingDefaultsError(f"default top_k must be an integer, got {defaults['top_k']}")
        defaults["top_k"] = max(int(defaults["top_k"]), 0)  # generation_config's -1 means off, as our 0
    try:
        SamplingParams().with_defaults(defaults, given=frozenset())
    except SamplingError as e:
        raise SamplingDefaultsError(f"default {e.param}: {e}") from None
    return {k: float(v) for k, v in defaults.items()}
