"""The named, seeded benchmark workloads: one definition used by every `pageserve bench` command.

    throughput   64 requests, prompts uniform in [32, 512] random ids, outputs uniform in [16, 256]
                 (seed 0: 17,709 prompt + 8,885 output tokens; the standard offline workload)
    chat         64 requests sharing one 384-token system prompt plus 32-128 tokens of their own,
                 64 output tokens each (prefix caching's case)
    long         4 requests with 1,500-token prompts among 28 short ones (32-128 tokens, 64 out):
                 chunked prefill's case, short requests' inter-token latency during a long prompt
    multitenant  tenant "heavy" floods with 4x the requests of tenant "light", interleaved at random
                 (at a request rate the heavy one arrives 4x as often); each 64-256 prompt, 64 out

Prompts are random non-special token ids (SmolLM2's 0..16 are special) and every
request ignores EOS, so the token counts are exact for any system. The list
order is the arrival order. numpy only: the HTTP load generator imports this
without torch. This module owns the definitions; it does not know how they are sent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FIRST_ORDINARY_ID = 17
"""SmolLM2's ids 0..16 are special tokens; random prompts avoid them."""
DEFAULT_VOCAB = 49_152
"""SmolLM2's vocabulary: the commands that do not load the model draw ids below it."""
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: tuple[int, ...]
    output_len: int
    """Exactly this many tokens are generated (EOS ignored)."""
    tenant: str = DEFAULT_TENANT


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[WorkloadRequest, ...]
    seed: int = 0

    @property
    def prompts(self) -> list[list[int]]:
        return [list(r.prompt) for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt) for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def tenants(self) -> list[str]:
        return sorted({r.tenant for r in self.requests})

    def only(self, tenant: str) -> Workload:
        return Workload(f"{self.name}[{tenant}]", tuple(r for r in self.requests if r.tenant == tenant), self.seed)


def _ids(rng: np.random.Generator, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(FIRST_ORDINARY_ID, vocab, n))


def make_random(n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int = DEFAULT_VOCAB,
                seed: int = 0, name: str = "throughput") -> Workload:
    """Uniform prompt and output lengths; the draw order (lengths, then ids) is the standard workload's."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(prompt_range[0], prompt_range[1] + 1, n)
    output_lens = rng.integers(output_range[0], output_range[1] + 1, n)
    prompts = [_ids(rng, int(p), vocab) for p in prompt_lens]
    return Workload(name, tuple(WorkloadRequest(p, int(o)) for p, o in zip(prompts, output_lens, strict=True)), seed)


def throughput(vocab: int = DEFAULT_VOCAB, seed: int = 0) -> Workload:
    return make_random(64, (32, 512), (16, 256), vocab, seed)


def chat(vocab: int = DEFAULT_VOCAB, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    system = _ids(rng, 384, vocab)
    own = rng.integers(32, 129, 64)
    reqs = tuple(WorkloadRequest(system + _ids(rng, int(n), vocab), 64) for n in own)
    return Workload("chat", reqs, seed)


LONG_PROMPT = 1500
LONG_EVERY = 8
"""One long prompt at every 8th arrival (positions 4, 12, 20, 28 of 32)."""


def long(vocab: int = DEFAULT_VOCAB, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(32):
        if i % LONG_EVERY == LONG_EVERY // 2:
            reqs.append(WorkloadRequest(_ids(rng, LONG_PROMPT, vocab), 32, "long"))
        else:
            reqs.append(WorkloadRequest(_ids(rng, int(rng.integers(32, 129)), vocab), 64, "short"))
    return Workload("long", tuple(reqs), seed)


HEAVY, LIGHT = "heavy", "light"
FLOOD_FACTOR = 4


def multitenant(vocab: int = DEFAULT_VOCAB, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    n_light = 12
    tenants = [HEAVY] * (n_light * FLOOD_FACTOR) + [LIGHT] * n_light
    order = rng.permutation(len(tenants))
    reqs = tuple(WorkloadRequest(_ids(rng, int(rng.integers(64, 257)), vocab), 64, tenants[int(i)]) for i in order)
    return Workload("multitenant", reqs, seed)


WORKLOADS: dict[str, Callable[[int, int], Workload]] = {
    "throughput": throughput,
    "chat": chat,
    "long": long,
    "multitenant": multitenant,
}


def get_workload(name: str, vocab: int = DEFAULT_VOCAB, seed: int = 0) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name](vocab, seed)
