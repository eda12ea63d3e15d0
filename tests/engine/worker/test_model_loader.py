"""engine/worker/model_loader.py: any local Llama-family folder loads; anything else gets a typed error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine.config import ModelConfig
from engine.worker import model_loader
from engine.worker.layers import linear as linear_mod
from engine.worker.model_loader import load_model
from engine.worker.models.spec import ModelConfigError
from pageserve_kernels import choice
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import hf_greedy, make_llm, random_prompts
from tests.support.tiny_model import tiny_llama_folder


def test_linear_rope_scaling_and_untied_head_match_hf(tmp_path: Path) -> None:
    folder = tiny_llama_folder(tmp_path, seed=5, num_layers=2, tie_word_embeddings=False,
                               rope_scaling={"rope_type": "linear", "factor": 4.0})
    prompts = random_prompts([30, 7], 512, seed=6)
    results = make_llm(folder).generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                                        detokenize=False)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == hf_greedy(hf, prompt, 16)


def test_loaded_shape_and_fused_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With F.linear for every product the layers keep the raw (fused) weights: they are what is multiplied."""
    monkeypatch.setattr(linear_mod, "_PLANS", {})
    monkeypatch.setenv(choice.FORCE_ENV, "linear=torch")
    folder = tiny_llama_folder(tmp_path, num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=64)
    loaded = load_model(ModelConfig(str(folder), dtype="bfloat16", max_model_len=100))
    s = loaded.shape
    assert (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.tie_word_embeddings) == (2, 4, 2, 16, True)
    assert loaded.max_model_len == 100 and loaded.eos_token_id == 2
    attn = loaded.model.layers[0].attn
    assert attn.qkv_weight.shape == ((4 + 2 * 2) * 16, 64) and attn.qkv_weight.dtype == torch.bfloat16
    assert loaded.model.lm_head is loaded.model.embed  # tied: one matrix
    raw = load_file(str(folder / "model.safetensors"))
    k = raw["model.layers.0.self_attn.k_proj.weight"].bfloat16()
    assert torch.equal(attn.qkv_weight[64:96], k)


def test_non_llama_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelConfigError, match="model_type=.gpt2. is not supported"):
        load_model(ModelConfig(str(tmp_path)))


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    folder = tiny_llama_folder(tmp_path, num_layers=2)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelConfigError, match="model.layers.1.mlp.up_proj.weight"):
        load_model(ModelConfig(str(folder)))


@pytest.mark.parametrize(("dtype", "flags", "warned"), [
    ("bfloat16", "flags\t\t: fpu avx avx2 fma", True),  # AVX2 only: bfloat16 is emulated
    ("bfloat16", "flags\t\t: fpu avx2 avx512f avx512_bf16", False),
    ("bfloat16", "flags\t\t: fpu avx2 amx_bf16 amx_tile", False),
    ("float16", "flags\t\t: fpu avx2 avx512_bf16", True),
    ("float32", "flags\t\t: fpu avx avx2 fma", False),
])
def test_half_dtype_without_cpu_support_is_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture, dtype: str, flags: str,
                                                  warned: bool) -> None:
    from pageserve_kernels import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_flags_line", lambda: flags)
    folder = tiny_llama_folder(tmp_path, num_layers=1)
    with caplog.at_level("WARNING", logger="pageserve.engine"):
        load_model(ModelConfig(str(folder), dtype=dtype))
    messages = [r.getMessage() for r in caplog.records if "no hardware support" in r.getMessage()]
    assert len(messages) == int(warned)
    if warned:
        assert dtype in messages[0] and "--dtype float32" in messages[0]


@pytest.mark.parametrize(("bf16_hardware", "device", "want"), [
    (True, "cpu", "bfloat16"), (False, "cpu", "float32"), (False, "cuda", "bfloat16"),
])
def test_auto_dtype_is_bfloat16_only_with_hardware_for_it(bf16_hardware: bool, device: str, want: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_loader, "has_bf16_hardware", lambda: bf16_hardware)
    assert model_loader.resolve_dtype("auto", device) == want
    assert model_loader.resolve_dtype("float32", device) == "float32"  # an explicit dtype is kept


def test_auto_is_the_default_and_resolved_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_loader, "has_bf16_hardware", lambda: False)
    folder = tiny_llama_folder(tmp_path, num_layers=1)
    loaded = load_model(ModelConfig(str(folder)))
    assert ModelConfig().dtype == "auto" and loaded.dtype == "float32"
    assert loaded.model.embed.dtype == torch.float32


def test_no_weight_keeps_the_checkpoint_file_mapped(tmp_path: Path) -> None:
    """The checkpoint's tensors are views of the file's mapping: one kept as it was (the embedding, a norm)
    kept the whole file mapped and resident (+3.3 GB for Qwen3-1.7B). Loaded, the file is no longer mapped."""
    folder = tiny_llama_folder(tmp_path, num_layers=2)
    loaded = load_model(ModelConfig(str(folder), dtype="float32"))
    files = {str(p.resolve()) for p in folder.glob("*.safetensors")}
    mapped = {line.split(maxsplit=5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if line.count(" ") >= 5}
    assert loaded.model is not None and not files & mapped, "a loaded weight still views the checkpoint file"


@pytest.mark.parametrize("spare_bytes", [0, None])
def test_second_packed_copies_only_where_memory_holds_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           spare_bytes: int | None) -> None:
    """Every shape's plan runs two layouts; with no memory to spare each weight is packed on one, the same in
    every layer (the C++ layer loop runs layer 0's plan for all), and the tokens do not change."""
    packed = [c for c in linear_mod.candidates(torch.float32) if c != "torch"]
    if not packed:
        pytest.skip("no packed product on this host: one layout is all there is")
    two = ("torch", "torch", packed[0], packed[0], packed[0], packed[0])
    monkeypatch.setattr(linear_mod, "choose_impls", lambda n, k, dtype: two)
    monkeypatch.setattr(linear_mod, "_PLANS", {})
    folder = tiny_llama_folder(tmp_path, num_layers=2)
    monkeypatch.setattr(model_loader, "available_bytes", lambda: 1 << 40)
    reserve = None if spare_bytes is None else (1 << 40) - spare_bytes
    model = load_model(ModelConfig(str(folder), dtype="float32"), reserve_bytes=reserve).model
    plans = [p for layer in model.layers for p in (layer.attn.qkv_packed, layer.attn.o_packed,
                                                    layer.mlp.gate_up_packed, layer.mlp.down_packed)]
    layouts = {len({linear_mod.layout_of(i) for i in p.impls}) for p in plans + [model.lm_head_packed]}
    assert layouts == ({1} if spare_bytes == 0 else {2})
    assert len({p.impls for p in plans}) == 1
    x = torch.randn(3, model.shape.hidden_size)
    if spare_bytes == 0:  # the raw weight is gone: every bucket multiplies the packed copy
        assert model.layers[0].attn.qkv_weight.numel() == 0 and linear_mod.linear(
            x, model.layers[0].attn.qkv_weight, plans[0]).shape[0] == 3
