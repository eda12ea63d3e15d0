"""Reading PEFT adapters: each bad adapter is a LoraError naming its problem (the gateway's 400), and the
registry's loads, reloads, unloads and host cache keep a running request's weights. Adapters are written
with safetensors directly here (no model, no peft): milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.worker.lora.adapter import load_adapter
from engine.worker.lora.errors import LoraError, LoraNotFound
from engine.worker.lora.registry import LoraRegistry
from engine.worker.models.spec import ModelSpec

SPEC = ModelSpec(vocab_size=32, hidden_size=8, intermediate_size=12, num_layers=2, num_heads=2, num_kv_heads=1,
                 head_dim=4, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=True,
                 attention_bias=False, max_position_embeddings=64)
KEY = "base_model.model.model.layers.{}.{}.{}.lora_{}.weight"


def write(folder: Path, shapes: dict[tuple[int, str, str], tuple[tuple[int, int], tuple[int, int]]], *,
          r: int = 2, alpha: float = 4.0, **config: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for (layer, block, target), (a, b) in shapes.items():
        tensors[KEY.format(layer, block, target, "A")] = torch.randn(a)
        tensors[KEY.format(layer, block, target, "B")] = torch.randn(b)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    targets = sorted({t for _, _, t in shapes})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": alpha,
                                                            "target_modules": targets, **config}))
    return folder


def load(folder: Path, max_rank: int = 8, load_id: int = 1, packed: bool | None = None):  # type: ignore[no-untyped-def]
    return load_adapter(folder, "x", SPEC, max_rank=max_rank, dtype=torch.float32, device="cpu", load_id=load_id,
                        packed=packed)


GOOD = {(0, "self_attn", "q_proj"): ((2, 8), (8, 2)), (0, "self_attn", "v_proj"): ((2, 8), (4, 2)),
        (1, "mlp", "down_proj"): ((2, 12), (8, 2))}


def test_targets_land_on_their_fused_slices_with_the_scale_folded(tmp_path: Path) -> None:
    adapter = load(write(tmp_path / "a", GOOD), packed=False)  # the plain layout: PyTorch's reference
    qkv = adapter.layers[0]["qkv"]
    assert adapter.table is None and qkv.a_packed is None and qkv.a is not None
    assert qkv.a.shape == (4, 8)  # q's and v's A stacked: one shrink product
    assert [(s.start, s.end, s.r0, s.r1) for s in qkv.slices] == [(0, 8, 0, 2), (12, 16, 2, 4)]  # q | k | v
    assert set(adapter.layers[1]) == {"down"} and adapter.rank == 2
    from safetensors.torch import load_file

    b_q = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))[KEY.format(0, "self_attn", "q_proj", "B")]
    torch.testing.assert_close(qkv.slices[0].b, b_q * 2.0)  # alpha / r = 4 / 2


@pytest.mark.parametrize(("shapes", "config", "max_rank", "match"), [
    ({(0, "self_attn", "q_proj"): ((16, 8), (8, 16))}, {}, 8, "rank 16 is over --max-lora-rank 8"),
    ({(0, "self_attn", "q_proj"): ((2, 8), (8, 2)), (0, "self_attn", "rotary"): ((2, 8), (8, 2))}, {}, 8,
     "target module 'rotary' is not one of"),
    ({(0, "self_attn", "k_proj"): ((2, 8), (8, 2))}, {}, 8, r"do not fit the base model \(expected \(2, 8\) / \(4, 2\)\)"),
    ({(5, "self_attn", "q_proj"): ((2, 8), (8, 2))}, {}, 8, "layer 5 does not exist"),
    (GOOD, {"use_dora": True}, 8, "use_dora=True is not supported"),
    (GOOD, {"modules_to_save": ["lm_head"]}, 8, "modules_to_save"),
    ({(0, "self_attn", "q_proj"): ((2, 8), (8, 2)), (0, "self_attn", "qkv_proj"): ((2, 8), (16, 2))}, {}, 8,
     "qkv_proj overlaps another target of the same fused projection"),
])
def test_a_bad_adapter_is_an_error_naming_the_problem(tmp_path: Path, shapes, config, max_rank, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LoraError, match=match):
        load(write(tmp_path / "bad", shapes, **config), max_rank=max_rank)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="no adapter_config.json"):
        load(tmp_path / "nowhere")
    folder = write(tmp_path / "a", GOOD)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(LoraError, match="no adapter_model.safetensors"):
        load(folder)
    (folder / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LoraError, match="unreadable"):
        load(folder)


def test_registry_reloads_unloads_and_evicts_without_touching_live_loads(tmp_path: Path) -> None:
    registry = LoraRegistry(lambda path, name, load_id: load(Path(path), load_id=load_id), max_cpu_loras=2)
    for name in ("a", "b", "c"):
        registry.load(name, str(write(tmp_path / name, GOOD)))
    first_a = registry.resolve("a")
    registry.load("a", str(write(tmp_path / "a2", GOOD)))  # a reload: a new load id, the old one retired
    assert registry.resolve("a") != first_a
    registry.sweep(live_ids=[first_a])  # a request still runs on the first load: its weights stay
    assert registry.adapter(first_a).load_id == first_a
    registry.sweep(live_ids=[])
    with pytest.raises(KeyError):
        registry.adapter(first_a)
    assert registry.num_resident <= 2 and registry.evictions >= 1
    evicted = [n for n in ("b", "c") if registry._names[n] not in registry._resident]
    assert evicted, "one of b, c was evicted (cap 2)"
    write(tmp_path / evicted[0], {(0, "self_attn", "q_proj"): ((2, 8), (8, 2))})  # changed under the same load
    with pytest.raises(LoraError, match="changed on disk"):
        registry.resolve(evicted[0])
    registry.unload("c")
    with pytest.raises(LoraNotFound):
        registry.resolve("c")
    assert registry.names() == ["a", "b"]
    registry.load("b", str(tmp_path / "b"))  # loading it again reads the new files under a new id
    assert registry.adapter(registry.resolve("b")).load_id == registry.resolve("b")
