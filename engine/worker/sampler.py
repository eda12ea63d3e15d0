"""Next-token choice per request: greedy, temperature, top-k, top-p, seeds, min_tokens.

Input: logits (N, V) float32 of the sampled rows only, and per row the chunk
that asked for it (its SamplingParams, how many tokens it has generated, its EOS).

    1. min_tokens: rows that have generated fewer than min_tokens get EOS and
       their stop ids masked to -inf (they cannot stop yet).
    2. greedy rows (temperature 0): one argmax over all of them at once
       (pageserve_kernels/fused_ops.py `argmax_rows`: torch.argmax's result, faster).
    3. random rows: logits / temperature, then top-k and top-p filtering on one
       descending sort (only when a row asks for either), then one draw each
       from the request's own torch.Generator.

Every request owns a generator, keyed by its request_id, seeded from its seed
(or from the engine seed and a counter when it gives none) and advanced only by
its own draws: the same seed gives the same tokens whatever else shares the
batch. Generators are dropped when the scheduler reports the request finished.
This module knows nothing about tokenizers or the KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.outputs import ScheduledChunk
from pageserve_kernels.fused_ops import argmax_rows


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._seeder = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> list[int]:
        """logits (N, V) float32, one row per chunk -> N token ids."""
        assert logits.shape[0] == len(rows)
        self._mask_min_tokens(logits, rows)
        tokens = [0] * len(rows)
        greedy = [i for i, c in enumerate(rows) if c.sampling.greedy]
        if greedy:
            picked = argmax_rows(logits[greedy] if len(greedy) < len(rows) else logits).tolist()
            for i, t in zip(greedy, picked, strict=True):
                tokens[i] = t
        random = [i for i, c in enumerate(rows) if not c.sampling.greedy]
        if random:
            for i, t in zip(random, self._sample_random(logits[random], [rows[i] for i in random]), strict=True):
                tokens[i] = t
        return tokens

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop finished requests' generators."""
        for rid in request_ids:
            self._generators.pop(rid, None)

    @property
    def num_generators(self) -> int:
        return len(self._generators)

    def _mask_min_tokens(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> None:
        for i, c in enumerate(rows):
            if c.num_output_tokens < c.sampling.min_tokens:
                banned = list(c.sampling.stop_token_ids)
                if c.eos_token_id is not None:
                    banned.append(c.eos_token_id)
                if banned:
                    logits[i, banned] = float("-inf")

    def _sample_random(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> list[int]:
        """logits (R, V) of rows that sample at temperature > 0."""
        temps = torch.tensor([c.sampling.temperature for c in rows], dtype=logits.dtype)
        logits = logits / temps[:, None]
        vocab = logits.shape[1]
        if any(0 < c.sampling.top_k < vocab or c.sampling.top_p < 1.0 for c in rows):
            ordered, order = logits.sort(dim=-1, descending=True)  # (R, V) each
            # Back to vocabulary order, so a row's draw never depends on its neighbours' filters.
            logits = torch.empty_like(logits).scatter_(1, order, _filter_sorted(ordered, rows))
        probs = torch.softmax(logits, dim=-1)  # (R, V)
        out = []
        for r, c in enumerate(rows):
            noise = torch.empty(vocab).exponential_(generator=self._generator(c))
            out.append(int((probs[r] / noise).argmax()))  # argmax p / Exp(1) draws from Categorical(p)
        return out

    def _generator(self, chunk: ScheduledChunk) -> torch.Generator:
        gen = self._generators.get(chunk.request_id)
        if gen is None:
            seed = chunk.sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seeder))
            gen = torch.Generator().manual_seed(seed)
            self._generators[chunk.request_id] = gen
        return gen


def _filter_sorted(logits: torch.Tensor, rows: list[ScheduledChunk]) -> torch.Tensor:
    """Top-k then top-p on logits sorted in descending order (R, V); removed entries become -inf."""
    vocab = logits.shape[1]
    ks = torch.tensor([c.sampling.top_k if 0 < c.sampling.top_k < vocab else vocab for c in rows])
    ranks = torch.arange(vocab)[None, :]  # (1, V)
    logits = logits.masked_fill(ranks >= ks[:, None], float("-inf"))
    top_p = torch.tensor([c.sampling.top_p for c in rows], dtype=logits.dtype)
    if bool((top_p < 1.0).any()):
        probs = torch.softmax(logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        logits = logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return logits
