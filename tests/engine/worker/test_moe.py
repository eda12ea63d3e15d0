"""SparseMoE against transformers' own sparse-MoE blocks, filled through the checkpoint names transformers writes.

Each case builds a one-layer Mixtral / Qwen2-MoE / Qwen3-MoE for causal LM (hidden 64, 8 experts, top 2,
expert intermediate 48, shared 96) with every parameter perturbed (routes distinct, no ties), saves it
with save_pretrained, reads the safetensors back into our SparseMoE through moe_weights.load_moe, and
compares with the model's own block (the readable "eager" experts loop) on 37 tokens.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from engine.worker.layers import linear
from engine.worker.layers.moe import SparseMoE
from engine.worker.models.moe_weights import load_moe, moe_options, sparse_layers
from engine.worker.models.spec import ModelConfigError
from pageserve_kernels import choice

H, E, K, INTER, SHARED, TOKENS = 64, 8, 2, 48, 96, 37
COMMON = dict(vocab_size=32, hidden_size=H, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
              num_experts_per_tok=K)
# bfloat16: ours accumulates the k weighted outputs (and the shared expert's) in float32 and rounds once,
# transformers rounds each product and each add to bfloat16. Both route alike (the same bfloat16 router
# logits), so they differ by rounding only: at most BF16_ULPS units in the last place of the output's
# largest magnitude (measured: 0.5-1 ulp; these perturbed blocks give outputs up to about 20).
BF16_ULPS = 2


def _model(kind: str, norm_topk_prob: bool) -> torch.nn.Module:
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**COMMON, intermediate_size=INTER, num_local_experts=E))
    qwen = dict(**COMMON, moe_intermediate_size=INTER, num_experts=E, intermediate_size=80, norm_topk_prob=norm_topk_prob)
    if kind == "qwen2_moe":
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**qwen, shared_expert_intermediate_size=SHARED))
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**qwen))


def _saved(tmp: Path, kind: str, norm_topk_prob: bool, original_format: bool) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The perturbed model and the tensors its save_pretrained wrote."""
    torch.manual_seed(0)
    model = _model(kind, norm_topk_prob)
    model.config._experts_implementation = "eager"
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(tmp, save_original_format=original_format)
    with safe_open(str(tmp / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    cfg = model.config.to_dict()
    return model, {"tensors": tensors, "cfg": cfg}


def _ours(saved: dict[str, Any], kind: str, dtype: torch.dtype) -> tuple[SparseMoE, dict[str, torch.Tensor]]:
    tensors = dict(saved["tensors"])

    def take(name: str) -> torch.Tensor:
        try:
            return tensors.pop(name).to(dtype)
        except KeyError:
            raise ModelConfigError(f"tensor {name!r} is missing") from None

    moe = SparseMoE.from_options(moe_options(saved["cfg"]), H, dtype)
    load_moe(moe, take, "model.layers.0.", kind)
    return moe, tensors


CASES = [("mixtral", True), ("qwen2_moe", False), ("qwen2_moe", True), ("qwen3_moe", False), ("qwen3_moe", True)]


# The fused (3-D) naming for the two blocks whose names differ most from it: Mixtral's renamed block, Qwen2's shared expert.
FUSED = [("mixtral", True), ("qwen2_moe", True)]


@pytest.fixture(scope="module", params=[(*c, True) for c in CASES] + [(*c, False) for c in FUSED],
                ids=lambda p: f"{p[0]}-norm{int(p[1])}-{'hub' if p[2] else 'fused'}")
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    kind, norm, original = request.param
    model, saved = _saved(tmp_path_factory.mktemp(kind), kind, norm, original)
    return kind, norm, model, saved


def test_every_moe_tensor_is_read_and_the_options_match(case: tuple[Any, ...]) -> None:
    kind, norm, _, saved = case
    moe, left = _ours(saved, kind, torch.float32)
    assert not [n for n in left if "mlp" in n or "moe" in n]
    assert moe.norm_topk_prob == (norm or kind == "mixtral")
    assert (moe.shared_intermediate_size is not None) == (kind == "qwen2_moe")


def _block_out(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
    with torch.no_grad():
        return model.model.layers[0].mlp(x.unsqueeze(0)).squeeze(0)


def test_float32_equals_transformers(case: tuple[Any, ...]) -> None:
    kind, _, model, saved = case
    moe, _ = _ours(saved, kind, torch.float32)
    x = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(1))
    want = _block_out(model, x)
    assert want.abs().max() > 0.5  # a real signal, not a near-zero output that any bug matches
    torch.testing.assert_close(moe(x), want, atol=1e-5, rtol=1e-5)


def test_bfloat16_within_rounding_of_transformers(case: tuple[Any, ...]) -> None:
    kind, _, model, saved = case
    moe, _ = _ours(saved, kind, torch.bfloat16)
    x = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = _block_out(copy.deepcopy(model).bfloat16(), x).float()  # a copy: the module's model stays float32
    got = moe(x)
    assert got.dtype == torch.bfloat16
    ulp = 2.0 ** (torch.frexp(want.abs().max()).exponent.item() - 8)  # bfloat16: 8 significant bits
    torch.testing.assert_close(got.float(), want, atol=BF16_ULPS * ulp, rtol=0)


def test_experts_without_tokens_cost_nothing_and_change_nothing(case: tuple[Any, ...]) -> None:
    kind, _, model, saved = case
    moe, _ = _ours(saved, kind, torch.float32)
    x = torch.randn(2, H, generator=torch.Generator().manual_seed(2))  # 2 tokens x top 2: at most 4 of 8 experts
    _, experts = moe.route(x)
    idle = set(range(E)) - set(experts.flatten().tolist())
    assert idle
    # An idle expert's weights are never read: poisoning them changes nothing.
    want = _block_out(model, x)
    moe.experts_gate_up.data[sorted(idle)] = float("nan")
    torch.testing.assert_close(moe(x), want, atol=1e-5, rtol=1e-5)
    assert moe(x[:0]).shape == (0, H)


def test_shared_expert_gate_scales_the_shared_output(tmp_path: Path) -> None:
    model, saved = _saved(tmp_path, "qwen2_moe", False, True)
    moe, _ = _ours(saved, "qwen2_moe", torch.float32)
    x = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(3))
    block = model.model.layers[0].mlp
    with torch.no_grad():
        block.shared_expert_gate.weight.mul_(3.0)  # gate values spread over (0, 1), far from a constant
        moe.shared_expert_gate.mul_(3.0)
        gate = torch.sigmoid(block.shared_expert_gate(x))
    assert gate.min() < 0.2 and gate.max() > 0.8
    torch.testing.assert_close(moe(x), _block_out(model, x), atol=1e-5, rtol=1e-5)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    _, saved = _saved(tmp_path, "mixtral", True, True)
    del saved["tensors"]["model.layers.0.block_sparse_moe.experts.3.w3.weight"]
    with pytest.raises(ModelConfigError, match=r"experts\.3\.w3"):
        _ours(saved, "mixtral", torch.float32)


@pytest.mark.parametrize("impl", linear.candidates(torch.float32))
def test_packed_experts_give_the_same_output_and_free_the_raw_weights(
        impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")
    monkeypatch.setattr(linear, "_PLANS", {})
    monkeypatch.setenv(choice.FORCE_ENV, f"linear={impl}")
    g = torch.Generator().manual_seed(4)
    moe = SparseMoE(H, INTER, E, K, norm_topk_prob=True, dtype=torch.float32, shared_expert_intermediate_size=SHARED)
    for p in moe.parameters():
        p.data = torch.randn(p.shape, generator=g) * 0.2
    x = torch.randn(TOKENS, H, generator=g)
    want, raw = moe(x), moe.experts_gate_up.numel()
    moe.pack_weights()
    freed = impl != "torch"  # F.linear multiplies the raw weight: it stays
    assert moe.experts_gate_up.numel() == (0 if freed else raw) and moe.experts_down.numel() == (0 if freed else raw // 2)
    assert moe.shared_gate_up.numel() == (0 if freed else 2 * SHARED * H)
    for rows in (1, 5, TOKENS):
        torch.testing.assert_close(moe(x[:rows]), want[:rows], atol=1e-5, rtol=1e-5)


QWEN = {"model_type": "qwen3_moe", "num_hidden_layers": 6, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 48}


def test_sparse_layers() -> None:
    assert sparse_layers({"model_type": "mixtral", "num_hidden_layers": 3}) == (True, True, True)
    assert sparse_layers(QWEN) == (True,) * 6
    assert sparse_layers({**QWEN, "decoder_sparse_step": 2}) == (False, True, False, True, False, True)
    assert sparse_layers({**QWEN, "mlp_only_layers": [0, 4]}) == (False, True, True, True, False, True)
    assert sparse_layers({**QWEN, "decoder_sparse_step": 3, "mlp_only_layers": [5]}) == (False, False, True) + (
        False, False, False)
    assert sparse_layers({**QWEN, "num_experts": 0}) == (False,) * 6
    # transformers 5.25 writes Qwen3-MoE's expert count as num_local_experts
    no_count = {k: v for k, v in QWEN.items() if k != "num_experts"}
    assert sparse_layers({**no_count, "num_local_experts": 0}) == (False,) * 6


def test_moe_options() -> None:
    o = moe_options({**QWEN, "norm_topk_prob": True})
    assert (o.num_experts, o.top_k, o.norm_topk_prob, o.expert_intermediate_size) == (8, 2, True, 48)
    assert o.shared_expert_intermediate_size is None and o.round_routing_weights
    assert o.flops_per_token(64) == 2 * (64 * 8 + 2 * 3 * 64 * 48)  # router + the 2 experts a token visits
    q2 = moe_options({**QWEN, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 96})
    assert q2.shared_expert_intermediate_size == 96 and not q2.norm_topk_prob
    assert q2.flops_per_token(64) == o.flops_per_token(64) + 2 * (3 * 64 * 96 + 64)  # + shared expert and gate
    mix = moe_options({"model_type": "mixtral", "num_hidden_layers": 2, "num_local_experts": 8,
                       "num_experts_per_tok": 2, "intermediate_size": 48, "router_jitter_noise": 0.1,
                       "output_router_logits": True})  # both training-only: accepted
    assert mix.norm_topk_prob and not mix.round_routing_weights and mix.num_experts == 8
    with pytest.raises(ModelConfigError, match="lacks 'shared_expert_intermediate_size'"):
        moe_options({**QWEN, "model_type": "qwen2_moe"})  # transformers always builds it


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "llama"}, "no mixture-of-experts reader"),
    ({"hidden_act": "gelu"}, "silu only"),
    ({"num_experts_per_tok": 9}, "between 1 and the 8 experts"),
    ({"decoder_sparse_step": 0}, "at least 1"),
    ({"moe_intermediate_size": None}, "lacks 'moe_intermediate_size'"),
])
def test_moe_options_refuses_what_it_cannot_run(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        moe_options({**QWEN, **change})
