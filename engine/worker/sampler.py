"""Next-token choice per request: penalties, bias, greedy, temperature, min_p, top-k, top-p, seeds.

Input: logits (N, V) float32 of the sampled rows only, and per row the chunk
that asked for it (its SamplingParams, its prompt and output ids, its EOS).
One step, in vLLM V1's order, every transform over only the rows that use it
(engine/worker/logits_processors.py):

    0. the `processors` given at construction (a grammar's bitmask: the one place
       where per-row masks from outside the sampler enter), in order, in place
    1. raw logprobs of the rows that asked for them (engine/worker/logprobs.py)
    2. allowed_token_ids and bad_words masks, min_tokens mask, logit_bias, then repetition, frequency and presence penalties
    3. greedy rows (temperature 0): one argmax over all of them at once
    4. random rows: temperature, min_p, top-k/top-p, then argmax(p / noise) with
       noise ~ Exp(1) drawn from the request's own generator: a draw from Categorical(p)

Device rules (a CUDA step must never mix devices or wait per row): every tensor
is created on the logits' device, the generators live there too, and
`sample_on_device` never reads a value back: the token ids (and logprobs) are
copied to the host once, by `sample`. tests/engine/worker/test_sampler_device.py runs
the device part on PyTorch's `meta` device, which refuses mixed devices as CUDA
does and has no values to read back.

Every request owns a generator, keyed by its request_id, seeded from its seed
(or from the engine seed and a counter when it gives none) and advanced only by
its own draws: the same seed gives the same tokens whatever else shares the
batch. Generators are dropped when the scheduler reports the request finished.
This module knows nothing about tokenizers or the KV cache.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.outputs import ScheduledChunk
from engine.worker.logits_processors import (
    BatchLogitsProcessor,
    apply_allowed_tokens,
    apply_bad_words,
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
    mask_min_tokens,
)
from engine.worker.logprobs import PickedLogprobs, pick, take_raw
from pageserve_kernels.fused_ops import argmax_rows
from shared.protocol import TokenLogprob


@dataclass(frozen=True)
class DeviceSample:
    tokens: torch.Tensor
    """(N,) int64 on the logits' device."""
    logprobs: PickedLogprobs | None
    """The asking rows' logprobs, still on the device; None when no row asked."""


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: dict[int, TokenLogprob]
    """Batch position -> logprobs, for the rows that asked."""


class Sampler:
    def __init__(self, seed: int = 0, processors: Sequence[BatchLogitsProcessor] = ()) -> None:
        self.processors: list[BatchLogitsProcessor] = list(processors)
        """Applied first, in order, to every step's logits (structured outputs' bitmask goes here)."""
        self._generators: dict[str, torch.Generator | None] = {}
        self._seeder = random.Random(seed)
        """Seeds for requests that give none: plain Python, so no tensor is made off the logits' device."""

    def sample(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> list[int]:
        """logits (N, V) float32, one row per chunk -> N token ids."""
        return self.sample_with_logprobs(logits, rows).token_ids

    def sample_with_logprobs(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> SamplerOutput:
        out = self.sample_on_device(logits, rows)
        tokens = out.tokens.tolist()  # the step's one read-back (plus one per logprobs tensor)
        return SamplerOutput(tokens, {} if out.logprobs is None else out.logprobs.to_host())

    def sample_on_device(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> DeviceSample:
        """Everything on the logits' device, with no read-back; `logits` is changed in place."""
        assert logits.shape[0] == len(rows)
        for processor in self.processors:
            processor(logits, rows)
        raw = take_raw(logits, rows)
        apply_allowed_tokens(logits, rows)
        apply_bad_words(logits, rows)
        mask_min_tokens(logits, rows)
        apply_logit_bias(logits, rows)
        apply_penalties(logits, rows)
        greedy = [i for i, c in enumerate(rows) if c.sampling.greedy]
        random = [i for i, c in enumerate(rows) if not c.sampling.greedy]
        if not random:
            tokens = argmax_rows(logits)
        elif not greedy:
            tokens = self._sample_random(logits, rows)
        else:
            tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
            g, r = (torch.tensor(ix, dtype=torch.long, device=logits.device) for ix in (greedy, random))
            tokens[g] = argmax_rows(logits[g])
            tokens[r] = self._sample_random(logits[r], [rows[i] for i in random])
        return DeviceSample(tokens, None if raw is None else pick(raw, tokens))

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop finished requests' generators."""
        for rid in request_ids:
            self._generators.pop(rid, None)

    @property
    def num_generators(self) -> int:
        return len(self._generators)

    def _sample_random(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> torch.Tensor:
        """logits (R, V) of rows that sample at temperature > 0 -> (R,) token ids on the device."""
        logits = apply_top_k_top_p(apply_min_p(apply_temperature(logits, rows), rows), rows)
        probs = torch.softmax(logits, dim=-1)  # (R, V)
        noise = torch.empty_like(probs)
        for r, c in enumerate(rows):
            noise[r].exponential_(generator=self._generator(c, logits.device))
        return (probs / noise).argmax(dim=-1)  # argmax p / Exp(1) draws from Categorical(p)

    def _generator(self, chunk: ScheduledChunk, device: torch.device) -> torch.Generator | None:
        if chunk.request_id not in self._generators:
            seed = chunk.sampling.seed
            if seed is None:
                seed = self._seeder.getrandbits(62)
            # The meta device (shape-only test runs) has no generators; its draws have no values anyway.
            self._generators[chunk.request_id] = (
                None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
            )
        return self._generators[chunk.request_id]
