"""Log probabilities for the rows that ask for them: taken on the device, read back once a step.

Which distribution: the raw model output, log_softmax(logits) before temperature,
penalties, logit_bias, min_p, top-k and top-p. That is vLLM V1's default
(`--logprobs-mode raw_logprobs`), so a client moving between the two servers gets the
same numbers. Transforms decided outside the sampler (a structured-output grammar's
bitmask, engine/worker/logits_processors.py's BatchLogitsProcessor) are applied before, as
vLLM applies its grammar bitmask before its sampler.

Only rows whose request set `logprobs` pay: one log_softmax over those rows, a
gather of the sampled ids and one topk at the largest k asked for; each row keeps
its own k when read back. Nothing here syncs with the device until `to_host`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.outputs import ScheduledChunk
from shared.protocol import TokenLogprob


@dataclass(frozen=True)
class RawLogprobs:
    rows: list[int]
    """Positions in the batch of the rows that asked, in order."""
    ks: list[int]
    """Each of those rows' number of alternatives."""
    logprobs: torch.Tensor
    """(L, V) float32 log_softmax of the raw logits of those rows."""


def take_raw(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> RawLogprobs | None:
    """Before any sampling transform: the raw distribution of the rows that asked (None: no row did)."""
    rows = [i for i, c in enumerate(chunks) if c.sampling.logprobs is not None]
    if not rows:
        return None
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    ks = [chunks[i].sampling.logprobs or 0 for i in rows]
    return RawLogprobs(rows, ks, torch.log_softmax(logits[index].float(), dim=-1))


@dataclass(frozen=True)
class PickedLogprobs:
    """Device tensors of one step's logprobs, waiting for the step's single read-back."""

    raw: RawLogprobs
    sampled: torch.Tensor
    """(L,) the sampled tokens' logprobs."""
    top_values: torch.Tensor
    """(L, K) the K = max(ks) best logprobs, best first."""
    top_ids: torch.Tensor
    """(L, K) their token ids."""

    def to_host(self) -> dict[int, TokenLogprob]:
        """Batch position -> the row's TokenLogprob (its own k alternatives)."""
        sampled = self.sampled.tolist()
        values, ids = self.top_values.tolist(), self.top_ids.tolist()
        return {
            row: TokenLogprob(sampled[j], ids[j][:k], values[j][:k])
            for j, (row, k) in enumerate(zip(self.raw.rows, self.raw.ks, strict=True))
        }


def pick(raw: RawLogprobs, tokens: torch.Tensor) -> PickedLogprobs:
    """tokens (N,) the step's sampled ids on the device."""
    lp = raw.logprobs
    index = torch.tensor(raw.rows, dtype=torch.long, device=lp.device)
    sampled = lp.gather(1, tokens[index][:, None]).squeeze(1)  # (L,)
    top_values, top_ids = lp.topk(max(raw.ks), dim=-1)  # (L, K); K may be 0
    return PickedLogprobs(raw, sampled, top_values, top_ids)


def beam_candidates(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> dict[int, list[tuple[int, float]]]:
    """Batch position -> the 2 x width most likely next tokens and their raw logprobs, best first,
    for beam-search rows (engine/scheduling/beam_group.py ranks them): one log_softmax and one
    topk over those rows, read back at once. Empty (no work) when no row searches beams."""
    rows = [i for i, c in enumerate(chunks) if c.sampling.beam_width]
    if not rows:
        return {}
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    ks = [2 * chunks[i].sampling.beam_width for i in rows]
    lp = torch.log_softmax(logits[index].float(), dim=-1)  # (B, V)
    values, ids = lp.topk(min(max(ks), lp.shape[-1]), dim=-1)  # (B, K), best first
    values_l, ids_l = values.tolist(), ids.tolist()
    return {row: list(zip(ids_l[j][:k], values_l[j][:k], strict=True)) for j, (row, k) in enumerate(zip(rows, ks,
                                                                                                     strict=True))}
