"""engine/worker/sampling_defaults.py: generation_config.json, the model card fallback, --default-sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.serving.main import build_parser
from engine.worker.sampling_defaults import SamplingDefaultsError, resolve_sampling_defaults


def folder(tmp_path: Path, generation_config: dict[str, object] | None) -> Path:
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    return tmp_path


def test_generation_config_values_become_defaults(tmp_path: Path) -> None:
    path = folder(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 2,
                             "max_new_tokens": 100})
    assert resolve_sampling_defaults(path, "any", None) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20.0}


def test_the_flag_overrides_key_by_key(tmp_path: Path) -> None:
    path = folder(tmp_path, {"temperature": 0.6, "top_p": 0.95})
    got = resolve_sampling_defaults(path, "any", '{"temperature": 0.1, "min_p": 0.05}')
    assert got == {"temperature": 0.1, "top_p": 0.95, "min_p": 0.05}


def test_a_packaged_model_without_sampling_values_gets_its_model_cards(tmp_path: Path) -> None:
    path = folder(tmp_path, {"bos_token_id": 1, "eos_token_id": 2})  # what the converted SmolLM2 GGUF holds
    assert resolve_sampling_defaults(path, "smollm2", None) == {"temperature": 0.2, "top_p": 0.9}
    assert resolve_sampling_defaults(path, "other-model", None) == {}
    assert resolve_sampling_defaults(path, "smollm2", '{"temperature": 1.0}') == {"temperature": 1.0, "top_p": 0.9}


def test_generation_configs_top_k_minus_one_means_off(tmp_path: Path) -> None:
    assert resolve_sampling_defaults(folder(tmp_path, {"top_k": -1}), "x", None) == {"top_k": 0.0}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("{not json", "not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"max_tokens": 5}', "unknown field 'max_tokens'"),
        ('{"temperature": 9}', "default temperature"),
        ('{"top_k": 2.5}', "top_k must be an integer"),
        ('{"top_p": "high"}', "must be a number"),
    ],
)
def test_bad_flag_values_are_refused_at_start(tmp_path: Path, flag: str, message: str) -> None:
    with pytest.raises(SamplingDefaultsError, match=message):
        resolve_sampling_defaults(folder(tmp_path, None), "x", flag)


def test_the_engine_flag_exists() -> None:
    args = build_parser().parse_args(["--default-sampling", '{"temperature": 0.7}'])
    assert args.default_sampling == '{"temperature": 0.7}'
