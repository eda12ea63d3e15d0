"""Logits at float32 resolution where it decides: each row's near-maximum, recomputed exactly.

A bfloat16 (or float16) vocab product rounds its outputs: at logits of 16-32 a bfloat16 value moves
in steps of 0.125, and two tokens whose exact products differ by less tie. On the README's demo
prompt SmolLM2's first token was such a tie ('L' and 'The' both 25.375 after rounding, 25.3383 and
25.3443 exactly); greedy took the lower id and the answer began "L'Étoile" instead of "The capital
of France is Paris." Only the tokens that could be a row's largest before the rounding need the
exact value: those within one unit in the last place of the row's maximum
(pageserve_kernels.fused_ops.near_max_candidates, one C pass on the CPU) are recomputed in float32
from the same low-precision inputs, a few dot products a row. The rest keep the rounded value, as
before. float32 logits pass through untouched.
"""

from __future__ import annotations

import torch

from pageserve_kernels.fused_ops import near_max_candidates

SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11}
"""Bits of precision including the implicit one: a value in [2^e, 2^(e+1)) moves in steps of 2^(e+1-bits)."""


def exact_near_max(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """logits (N, V) = hidden (N, H) @ weight (V, H)^T in the model dtype -> (N, V) float32, where every
    logit that could be its row's largest is the exact float32 product. A flat row (more candidates than
    pageserve_kernels.fused_ops.NEAR_MAX_LISTED) keeps the rounded values."""
    out = logits.float()
    bits = SIGNIFICAND_BITS.get(logits.dtype)
    if bits is None or out.numel() == 0:
        return out
    found = near_max_candidates(out, bits)
    if found is not None:
        rows, cols = found
        out[rows, cols] = (hidden[rows].float() * weight[cols].float()).sum(dim=1)
    return out
