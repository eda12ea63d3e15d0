"""exact_near_max: a tie made by rounding the vocab product is broken by the exact products."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.worker.layers.exact_logits import exact_near_max


def _tie() -> tuple[torch.Tensor, torch.Tensor]:
    """Two tokens whose products, 25.3203125 and 25.34375, both round to 25.375 in bfloat16."""
    hidden = torch.tensor([[1.0, 1.0]]).bfloat16()
    weight = torch.tensor([[25.0, 0.3203125], [25.0, 0.34375], [3.0, 0.0]]).bfloat16()
    return hidden, weight


def test_the_exact_products_break_a_rounding_tie() -> None:
    hidden, weight = _tie()
    rounded = F.linear(hidden, weight)
    assert rounded[0, 0] == rounded[0, 1] and int(rounded.float().argmax()) == 0  # greedy took the lower id
    logits = exact_near_max(rounded, hidden, weight)
    assert logits.dtype == torch.float32 and int(logits.argmax()) == 1
    assert logits[0, :2].tolist() == [25.3203125, 25.34375] and logits[0, 2] == 3.0  # the rest as rounded


def test_float32_logits_pass_through() -> None:
    hidden, weight = torch.randn(4, 8), torch.randn(20, 8)
    logits = F.linear(hidden, weight)
    assert torch.equal(exact_near_max(logits, hidden, weight), logits)


def test_the_model_breaks_ties_too() -> None:
    """DecoderModel.compute_logits goes through exact_near_max (the vocab product of a bfloat16 model)."""
    from engine.worker.models.decoder import DecoderModel
    from engine.worker.models.spec import ModelSpec

    hidden, weight = _tie()
    model = DecoderModel.__new__(DecoderModel)
    torch.nn.Module.__init__(model)
    model.shape = ModelSpec(vocab_size=20, hidden_size=8, intermediate_size=8, num_layers=0, num_heads=1,
                            num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=None,
                            tie_word_embeddings=False, attention_bias=False, max_position_embeddings=8)
    model.norm = torch.nn.Identity()
    model.lm_head = torch.nn.Parameter(weight, requires_grad=False)
    model.lm_head_packed = None
    assert int(model.compute_logits(hidden).argmax()) == 1
