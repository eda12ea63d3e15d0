"""pageserve_kernels/lora_pack.py's C layout against PyTorch's (cpu_lora.pack_a, cpu_gemm.pack_panels of the
plain tensors adapter.py builds with packed=False), bit for bit: float32, bfloat16 and float16 files into
both serving dtypes, odd widths, ranks 1-64, fused slices (q/k/v, gate/up), the rsLoRA scale, and the adapter
keeping only the packed form. Skipped only where this host cannot build the LoRA kernel or the packer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import engine.worker.lora.adapter as adapter_module
from engine.worker.lora import safetensors_file
from engine.worker.lora.adapter import LoraAdapter, kernel_table, load_adapter
from engine.worker.lora.errors import LoraError
from engine.worker.lora.prefaulted_pages import Pages
from engine.worker.models.spec import ModelSpec
from pageserve_kernels import cpu_lora, lora_pack

# odd widths everywhere: hidden 37, q 3 x 5 = 15, k and v 5 each, intermediate 23
SPEC = ModelSpec(vocab_size=32, hidden_size=37, intermediate_size=23, num_layers=2, num_heads=3, num_kv_heads=1,
                 head_dim=5, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=True,
                 attention_bias=False, max_position_embeddings=64)
SHAPES = {"self_attn.q_proj": (37, 15), "self_attn.k_proj": (37, 5), "self_attn.v_proj": (37, 5),
          "self_attn.o_proj": (15, 37), "mlp.gate_proj": (37, 23), "mlp.up_proj": (37, 23), "mlp.down_proj": (23, 37)}
KEY = "base_model.model.model.layers.{}.{}.lora_{}.weight"


def needs(dtype: torch.dtype) -> None:
    if cpu_lora.load(dtype) is None or lora_pack.load() is None:
        pytest.skip(f"no {dtype} LoRA kernel or no packer on this host (instructions or C compiler)")


def write(folder: Path, rank: int, source: torch.dtype, *, rslora: bool = False, seed: int = 0,
          targets: tuple[str, ...] = tuple(SHAPES)) -> Path:
    """A PEFT folder: layer 0 with every target at `rank`, layer 1 with q and v only at rank + 1 (two stacks of
    different ranks in one buffer); values of every magnitude and sign, some exactly halfway for bfloat16."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer, names, r in ((0, targets, rank), (1, ("self_attn.q_proj", "self_attn.v_proj"), rank + 1)):
        for name in names:
            fan_in, fan_out = SHAPES[name]
            for which, shape in (("A", (r, fan_in)), ("B", (fan_out, r))):
                t = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
                t.view(-1)[::7] = torch.tensor(1.0 + 2**-8)  # a tie in bfloat16: rounds to even
                tensors[KEY.format(layer, name, which)] = t.to(source).contiguous()
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 7.0, "use_rslora": rslora, "target_modules": []}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def load(folder: Path, dtype: torch.dtype, packed: bool | None) -> LoraAdapter:
    return load_adapter(folder, "x", SPEC, max_rank=65, dtype=dtype, device="cpu", load_id=1, packed=packed)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits: -0.0 is not 0.0, a NaN equals its own pattern."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def assert_same_layout(c: LoraAdapter, plain: LoraAdapter) -> None:
    """c's packed tensors are exactly PyTorch's packing of plain's tensors; c keeps no plain tensor."""
    assert [set(layer) for layer in c.layers] == [set(layer) for layer in plain.layers]
    for c_layer, p_layer in zip(c.layers, plain.layers, strict=True):
        for name, p in p_layer.items():
            cl = c_layer[name]
            assert cl.a is None and cl.a_packed is not None and p.a is not None
            assert torch.equal(bits(cl.a_packed), bits(cpu_lora.pack_a(p.a))), name
            for cs, ps in zip(cl.slices, p.slices, strict=True):
                assert (cs.start, cs.end, cs.r0, cs.r1) == (ps.start, ps.end, ps.r0, ps.r1)
                assert cs.b is None and cs.panels is not None and ps.b is not None
                assert torch.equal(bits(cs.panels), bits(cpu_lora.pack_b(ps.b))), (name, cs.start)
                assert cs.panels.data_ptr() % lora_pack.ALIGN == 0 and cl.a_packed.data_ptr() % lora_pack.ALIGN == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rank", [1, 8, 16, 41, 64])
def test_the_c_layout_is_pytorchs_bit_for_bit(tmp_path: Path, dtype: torch.dtype, source: torch.dtype,
                                                rank: int) -> None:
    needs(dtype)
    folder = write(tmp_path / "a", rank, source, rslora=rank == 41, seed=rank)
    c, plain = load(folder, dtype, None), load(folder, dtype, False)
    assert c.rank == plain.rank == rank + 1 and c.dtype == plain.dtype == dtype
    assert_same_layout(c, plain)
    assert torch.equal(c.table, kernel_table(c.layers))  # type: ignore[arg-type]
    assert c.nbytes == sum(t.nbytes for layer in c.layers for p in layer.values()
                           for t in (p.a_packed, *(s.panels for s in p.slices)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_targets_share_one_stack_and_a_q_only_adapter_pads_the_rest(tmp_path: Path,
                                                                           dtype: torch.dtype) -> None:
    """qkv_proj and gate_up_proj as single targets (the fused name) beside o and down, and q alone."""
    needs(dtype)
    g = torch.Generator().manual_seed(5)
    tensors = {}
    for name, (fan_in, fan_out) in {"self_attn.qkv_proj": (37, 25), "mlp.gate_up_proj": (37, 46),
                                    "mlp.down_proj": (23, 37)}.items():
        tensors[KEY.format(0, name, "A")] = torch.randn(3, fan_in, generator=g)
        tensors[KEY.format(0, name, "B")] = torch.randn(fan_out, 3, generator=g)
    folder = tmp_path / "fused"
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 3, "lora_alpha": 5}))
    assert_same_layout(load(folder, dtype, None), load(folder, dtype, False))
    q_only = write(tmp_path / "q", 4, torch.float32, targets=("self_attn.q_proj",))
    assert_same_layout(load(q_only, dtype, None), load(q_only, dtype, False))


def test_a_header_pointing_outside_the_file_is_an_error_not_a_read(tmp_path: Path) -> None:
    needs(torch.float32)
    folder = write(tmp_path / "a", 2, torch.float32)
    path = folder / "adapter_model.safetensors"
    data = bytearray(path.read_bytes())
    path.write_bytes(data[: len(data) - 4])  # the last tensor's bytes cut short
    with pytest.raises(LoraError, match=r"do not hold F32 \[.*\] inside the file"):
        load(folder, torch.float32, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [1, 8, 41, 64])
def test_the_layout_lands_on_the_pages_mapped_beside_the_read(tmp_path: Path, dtype: torch.dtype, rank: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """packed_layout.bound_bytes, from the header alone, is never short of the layout (else the pages go
    unused and a fresh mapping faults in after the read), and a load that fails its checks unmaps them."""
    needs(dtype)
    made: list[Pages] = []
    taken: list[bool] = []
    real_init, real_take = Pages.__init__, Pages.take

    def init(self: Pages, nbytes: int) -> None:
        real_init(self, nbytes)
        made.append(self)

    def take(self: Pages, nbytes: int) -> torch.Tensor | None:
        got = real_take(self, nbytes)
        taken.append(got is not None)
        return got
    parsed: list[object] = []
    real_header = safetensors_file.read_header

    def counted_header(*args: object, **kwargs: object) -> object:
        parsed.append(args[0])
        return real_header(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(Pages, "__init__", init)
    monkeypatch.setattr(Pages, "take", take)
    monkeypatch.setattr(safetensors_file, "read_header", counted_header)
    monkeypatch.setattr(adapter_module, "read_header", counted_header)
    folder = write(tmp_path / "a", rank, torch.float32, seed=rank)
    c = load(folder, dtype, None)
    assert taken == [True], taken
    assert len(parsed) == 1  # the header read before the file is the one used: parsed once a load
    assert_same_layout(c, load(folder, dtype, False))
    with pytest.raises(LoraError, match="over --max-lora-rank"):
        load_adapter(folder, "x", SPEC, max_rank=rank, dtype=dtype, device="cpu", load_id=2)
    assert len(made) == 2 and made[1]._address is None  # released: the failed load holds no pages
