"""`pageserve bench make-model`: the folders it writes are what transformers, vLLM and our engine expect.

Every shape is checked twice: at its real widths (one layer) its tensor list equals the
state_dict of transformers' own model built from the written config.json on the meta
device (no memory); shrunk (`--layers 1 --set ...`) it is written for real and loaded by
transformers' from_pretrained with no missing, unexpected or mismatched tensor. The
Llama shape also runs through our engine's loader and generates.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from ops.bench import make_model
from ops.bench.model_shapes import SHAPES

SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "vocab_size": 49152, "moe_intermediate_size": 32, "num_experts": 8}
"""Shrinks any shape to a few MB; vocab_size stays the tokenizer's (49,152)."""


def _small_args(shape: str, out: Path) -> list[str]:
    return [shape, str(out), "--layers", "1", *[f"--set={k}={v}" for k, v in SMALL.items()]]


def _hf_model_tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """transformers' own model for the folder's config.json, on the meta device: names and shapes only."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    skip = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in skip}


def _fold_experts(specs: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The Hub's per-expert tensors as transformers 5 holds them: one (E, 2I, H) gate_up and one (E, H, I) down."""
    out: dict[str, tuple[int, ...]] = {}
    experts: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in specs.items():
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)_proj\.weight", name)
        if m:
            experts.setdefault(m[1], {})[f"{m[2]}.{m[3]}"] = shape
        else:
            out[name] = shape
    for prefix, parts in experts.items():
        n = len({k.split(".")[0] for k in parts})
        inter, hidden = parts["0.gate"]
        assert all(parts[f"{e}.{p}"] == parts[f"0.{p}"] for e in range(n) for p in ("gate", "up", "down"))
        out[f"{prefix}.gate_up_proj"] = (n, 2 * inter, hidden)
        out[f"{prefix}.down_proj"] = (n, hidden, inter)
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_real_widths_match_transformers_model(shape: str, tmp_path: Path) -> None:
    config = make_model.shaped_config(shape, layers=1)
    make_model._write_metadata(config, tmp_path)  # config.json only: no weights at full width
    specs = {s.name: s.shape for s in make_model.tensor_specs(config)}
    assert _fold_experts(specs) == _hf_model_tensors(tmp_path)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_config_round_trips_through_autoconfig(shape: str, tmp_path: Path) -> None:
    from transformers import AutoConfig

    make_model._write_metadata(make_model.shaped_config(shape), tmp_path)
    hub: dict[str, Any] = SHAPES[shape]["config"]
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == hub["model_type"] and cfg.architectures == hub["architectures"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
                "rms_norm_eps", "head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok"):
        if key in hub:
            assert getattr(cfg, key) == hub[key], key
    rope = cfg.rope_parameters  # transformers 5 folds rope_theta and rope_scaling into one dict
    assert rope["rope_theta"] == hub["rope_theta"]
    for key, value in (hub.get("rope_scaling") or {"rope_type": "default"}).items():
        assert rope[key] == value, key
    assert cfg.dtype == torch.bfloat16
    assert (cfg.bos_token_id, cfg.eos_token_id) == (1, 2)  # SmolLM2's: the tokenizer's EOS ends text
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.mark.parametrize("shape", list(SHAPES))
def test_small_folder_loads_in_transformers(shape: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert make_model.main(_small_args(shape, tmp_path / "m")) == 0
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "m", output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    assert model.dtype == torch.bfloat16
    assert {f.name for f in (tmp_path / "m").iterdir()} >= {"tokenizer.json", "tokenizer_config.json",
                                                             "config.json", "model.safetensors"}


def test_values_are_sane_and_reproducible(tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        make_model.write_model("qwen2.5-0.5b", tmp_path / name, seed=seed, layers=1, overrides=SMALL)

    def read(name: str) -> dict[str, torch.Tensor]:
        with safe_open(str(tmp_path / name / "model.safetensors"), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118

    a, b, c = read("a"), read("b"), read("c")
    q = a["model.layers.0.self_attn.q_proj.weight"]  # (128, 128)
    assert q.dtype == torch.bfloat16 and abs(q.float().std().item() - 0.02) < 0.002
    assert torch.equal(a["model.norm.weight"], torch.ones(128, dtype=torch.bfloat16))
    assert "model.layers.0.self_attn.k_proj.bias" in a  # Qwen2's q/k/v biases
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_shards_and_index(tmp_path: Path) -> None:
    made = make_model.write_model("llama-3.2-1b", tmp_path / "m", layers=2, overrides=SMALL,
                                  max_shard_bytes=4 * 10**6)
    index = json.loads((made.path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    held = {}
    for shard in shards:
        with safe_open(str(made.path / shard), framework="pt") as f:
            held.update({k: shard for k in f.keys()})  # noqa: SIM118
    assert held == index["weight_map"]
    assert index["metadata"]["total_size"] == made.nbytes
    assert not (made.path / "model.safetensors").exists()


def test_refuses_a_vocabulary_below_the_tokenizers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert make_model.main(["qwen3-0.6b", str(tmp_path / "m"), "--layers", "1", "--set", "vocab_size=1000"]) == 2
    assert "below the tokenizer's 49152" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    (tmp_path / "notes.txt").write_text("someone's")
    assert make_model.main(_small_args("qwen3-0.6b", tmp_path)) == 2  # not an empty folder
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_llama_folder_generates_through_our_engine(tmp_path: Path) -> None:
    from engine.llm import LLM
    from shared.sampling import SamplingParams

    made = make_model.write_model("llama-3.2-1b", tmp_path / "llama", layers=1, overrides=SMALL)
    llm = LLM(str(made.path), dtype="float32", max_model_len=64, num_device_blocks=16, num_cpu_blocks=0)
    try:
        assert llm.model_info.eos_token_id == 2
        assert llm.core.model_path == made.path.resolve()
        out = llm.generate("The capital of France is", SamplingParams(max_tokens=5, temperature=0.0,
                                                                      ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 5
    finally:
        llm.close()


def test_an_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(make_model, "save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        make_model.write_model("qwen3-0.6b", tmp_path / "m", layers=1, overrides=SMALL)
    assert list(tmp_path.iterdir()) == []  # neither OUT nor its staging folder
