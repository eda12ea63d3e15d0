"""The sampler's logits transforms: each one touches only the rows whose request uses it.

Every function takes the step's logits (N, V) float32 and the N chunks they belong
to, and either changes the logits in place or returns the changed tensor. A batch
in which no request uses a transform pays one Python pass over its chunks and
launches nothing. Every tensor is created on the logits' device (token ids and
per-row values are built from Python lists straight onto it), and nothing here
reads a value back to the host: no device sync.

Definitions (the tests compare each with transformers' logits processors):

    min_tokens          EOS and stop ids -> -inf until min_tokens were generated (a row a
                        grammar restricts to them keeps them: the grammar wins)
    allowed_token_ids   every id not listed -> -inf                          (vLLM)
    bad_words           a word's last id -> -inf when the output ends with its other ids (vLLM's
                        NoBadWordsLogitsProcessor; a one-token word is always banned)
    logit_bias          logits[id] += bias                  (OpenAI; SequenceBiasLogitsProcessor)
    repetition_penalty  for ids in prompt or output: l > 0 ? l / p : l * p
                        (transformers' RepetitionPenaltyLogitsProcessor, vLLM's)
    frequency_penalty   logits[id] -= f * count of id in the output        (OpenAI)
    presence_penalty    logits[id] -= p * (id occurs in the output)        (OpenAI)
    min_p               drop ids with prob < min_p * max prob, after temperature (MinPLogitsWarper)
    top_k, top_p        on one descending sort; the best token always stays

`BatchLogitsProcessor` is the hook for transforms decided outside the sampler
(a structured-output grammar's token bitmask): a callable that changes (N, V)
logits in place for the rows it owns, applied first, before anything is read.
This module knows nothing about tokenizers, the scheduler or the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.outputs import ScheduledChunk

BatchLogitsProcessor = Callable[[torch.Tensor, Sequence[ScheduledChunk]], None]
"""(logits (N, V) float32, the N chunks) -> None; changes only its own rows, in place, on the
logits' device, without reading values back to the host (no per-row sync)."""


def _ids(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _values(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def mask_min_tokens(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    """Rows that generated fewer than min_tokens cannot stop yet: EOS and stop ids -> -inf.

    The grammar wins (as vLLM decides): a constrained row whose grammar is complete allows only
    its stop tokens, and masking them too would leave the row all -inf (argmax picks id 0, softmax
    gives NaN). Such a row keeps its stop tokens, and the request ends there ("stop",
    engine/scheduling/stop_conditions.py) before min_tokens."""
    plain: tuple[list[int], list[int]] = ([], [])
    constrained: tuple[list[int], list[int]] = ([], [])
    for i, c in enumerate(chunks):
        if c.num_output_tokens < c.sampling.min_tokens:
            banned = list(c.sampling.stop_token_ids)
            if c.eos_token_id is not None:
                banned.append(c.eos_token_id)
            rows, cols = constrained if c.grammar is not None else plain
            rows += [i] * len(banned)
            cols += banned
    if plain[0]:
        logits[_ids(plain[0], logits.device), _ids(plain[1], logits.device)] = float("-inf")
    if constrained[0]:
        _mask_unless_emptied(logits, _ids(constrained[0], logits.device), _ids(constrained[1], logits.device))


def _mask_unless_emptied(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """logits[rows, cols] -> -inf, except in rows that this would leave with no finite logit
    (on the device, no read-back: only rows with a grammar and min_tokens pay the row scan)."""
    kept = logits[rows, cols]  # (E,) a copy
    logits[rows, cols] = float("-inf")
    emptied = ~torch.isfinite(logits[rows]).any(dim=-1)  # (E,) per entry, its row's verdict
    logits[rows, cols] = torch.where(emptied, kept, torch.full_like(kept, float("-inf")))


def apply_allowed_tokens(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    """Rows with allowed_token_ids keep only those ids' logits (one masked copy of those rows)."""
    picked = [i for i, c in enumerate(chunks) if c.sampling.allowed_token_ids]
    if not picked:
        return
    rows = _ids(picked, logits.device)
    keep = torch.zeros(len(picked), logits.shape[1], dtype=torch.bool, device=logits.device)  # (P, V)
    flat_rows = [r for r, i in enumerate(picked) for _ in chunks[i].sampling.allowed_token_ids]
    flat_cols = [t for i in picked for t in chunks[i].sampling.allowed_token_ids]
    keep[_ids(flat_rows, logits.device), _ids(flat_cols, logits.device)] = True
    logits[rows] = logits[rows].masked_fill(~keep, float("-inf"))


def apply_bad_words(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    """Ban each bad word's last id where the output's tail matches the word's other ids (host-side
    comparison of short id lists; one scatter for the whole batch)."""
    rows: list[int] = []
    cols: list[int] = []
    for i, c in enumerate(chunks):
        out = c.output_token_ids
        for word in c.sampling.bad_words_token_ids:
            prefix = word[:-1]
            if len(prefix) <= len(out) and (not prefix or tuple(out[len(out) - len(prefix):]) == prefix):
                rows.append(i)
                cols.append(word[-1])
    if rows:
        logits[_ids(rows, logits.device), _ids(cols, logits.device)] = float("-inf")


def apply_logit_bias(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    rows: list[int] = []
    cols: list[int] = []
    biases: list[float] = []
    for i, c in enumerate(chunks):
        for token_id, bias in c.sampling.logit_bias:
            rows.append(i)
            cols.append(token_id)
            biases.append(bias)
    if rows:
        index = (_ids(rows, logits.device), _ids(cols, logits.device))
        logits.index_put_(index, _values(biases, logits), accumulate=True)


def token_counts(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """(R, V) float32: how often each id occurs in each row's list (one scatter, padded lists)."""
    width = max((len(t) for t in token_lists), default=0)
    padded = [list(t) + [vocab] * (width - len(t)) for t in token_lists]  # id `vocab`: a spill column
    ids = torch.tensor(padded, dtype=torch.long, device=device).reshape(len(token_lists), width)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    """Repetition (prompt + output), then frequency and presence (output), on the rows using any."""
    picked = [i for i, c in enumerate(chunks) if c.sampling.uses_penalties]
    if not picked:
        return
    device, vocab = logits.device, logits.shape[1]
    rows = _ids(picked, device)
    sub = logits[rows]  # (P, V) a copy
    params = [chunks[i].sampling for i in picked]
    output_counts = token_counts([chunks[i].output_token_ids for i in picked], vocab, device)  # (P, V)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = (token_counts([chunks[i].prompt_token_ids for i in picked], vocab, device) + output_counts) > 0
        penalty = _values([p.repetition_penalty for p in params], sub)[:, None]  # (P, 1)
        sub = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
    frequency = _values([p.frequency_penalty for p in params], sub)[:, None]
    presence = _values([p.presence_penalty for p in params], sub)[:, None]
    sub = sub - frequency * output_counts - presence * (output_counts > 0).to(sub.dtype)
    logits[rows] = sub


def apply_temperature(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    """logits (R, V) of rows that sample at temperature > 0."""
    return logits / _values([c.sampling.temperature for c in chunks], logits)[:, None]


def apply_min_p(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    picked = [i for i, c in enumerate(chunks) if c.sampling.min_p > 0.0]
    if not picked:
        return logits
    rows = _ids(picked, logits.device)
    sub = logits[rows]
    probs = torch.softmax(sub, dim=-1)  # (P, V)
    floor = _values([chunks[i].sampling.min_p for i in picked], sub)[:, None] * probs.amax(dim=-1, keepdim=True)
    logits = logits.clone()
    logits[rows] = sub.masked_fill(probs < floor, float("-inf"))
    return logits


def apply_top_k_top_p(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    """Top-k then top-p, on one descending sort; only when a row asks for either."""
    vocab = logits.shape[1]
    if not any(0 < c.sampling.top_k < vocab or c.sampling.top_p < 1.0 for c in chunks):
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)  # (R, V) each
    # Back to vocabulary order, so a row's draw never depends on its neighbours' filters.
    return torch.empty_like(logits).scatter_(1, order, _filter_sorted(ordered, chunks))


def _filter_sorted(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    """Top-k then top-p on logits sorted in descending order (R, V); removed entries become -inf."""
    vocab = logits.shape[1]
    ks = _ids([c.sampling.top_k if 0 < c.sampling.top_k < vocab else vocab for c in chunks], logits.device)
    ranks = torch.arange(vocab, device=logits.device)[None, :]  # (1, V)
    logits = logits.masked_fill(ranks >= ks[:, None], float("-inf"))
    if any(c.sampling.top_p < 1.0 for c in chunks):
        top_p = _values([c.sampling.top_p for c in chunks], logits)
        probs = torch.softmax(logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        logits = logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return logits
