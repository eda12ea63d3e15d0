"""Logits at float32 resolution where it decides: each row's near-maximum, recomputed exactly.

A bfloat16 (or float16) vocab product rounds its outputs: at logits of 16-32 a bfloat16 value moves
in steps of 0.125, and two tokens whose exact products differ by less tie. On the README's demo
prompt SmolLM2's first token was such a tie ('L' and 'The' both 25.375 after rounding, 25.3383 and
25.3443 exactly); greedy took the lower id and the answer began "L'Étoile" instead of "The capital
of France is Paris." Only the tokens that could be a row's largest before the rounding need the
exact value: those within one unit in the last place of the row's maximum are recomputed in float32
from the same low-precision inputs, a few dot products a row (pageserve_kernels.fused_ops.exact_logits:
with the float32 conversion, one C pass for bfloat16 on the CPU). The rest keep the rounded value.
A row with more than NEAR_MAX_LISTED candidates (flat) keeps its rounded values; each row is decided
alone, so a request's logits never depend on which others share its step. float32 logits pass
through untouched.
"""

from __future__ import annotations

import torch

from pageserve_kernels.fused_ops import exact_logits

SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11}
"""Bits of precision including the implicit one: a value in [2^e, 2^(e+1)) moves in steps of 2^(e+1-bits)."""


def exact_near_max(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """logits (N, V) = hidden (N, H) @ weight (V, H)^T in the model dtype -> (N, V) float32, where every
    logit that could be its row's largest is the exact float32 product."""
    bits = SIGNIFICAND_BITS.get(logits.dtype)
    if bits is None or logits.numel() == 0:
        return logits.float()
    return exact_logits(logits, hidden, weight, bits)
