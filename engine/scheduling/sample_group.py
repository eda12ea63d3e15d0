"""Parallel sampling (n > 1): one client request becomes n internal samples.

Sample i is a `Request` with id f"{client_id}#{i}" (the client id itself when
n == 1), `n=1`, and seed `seed + i` when a seed is given: so sample i produces
exactly what a lone request with seed `seed + i` produces. Sample 0 (the leader)
prefills the prompt; the others wait as `pending` until the leader's prompt KV is
written, then fork: they share its blocks covering the first P - 1 prompt tokens by
reference count and each recomputes only the last prompt token (to sample its own
first token), copying the shared partial block on that first write.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.outputs import RequestDelta
from engine.request import Request
from shared.protocol import TokenLogprob


@dataclass(eq=False)
class SampleGroup:
    client_id: str
    samples: list[Request]
    pending: list[Request] = field(default_factory=list)
    """Samples waiting for the leader's prompt; they hold no blocks and no queue slot."""
    queue_seconds: float | None = None
    """From add_request to the leader's first admission (scheduler clock); None while never scheduled."""

    @property
    def leader(self) -> Request:
        return self.samples[0]

    @property
    def live(self) -> list[Request]:
        return [s for s in self.samples if not s.status.finished]


@dataclass(eq=False)
class SampleState:
    """The scheduler's bookkeeping for one live sample."""

    req: Request
    group: SampleGroup
    index: int
    """The sample's choice index within its group."""
    seq: int
    """Arrival order, kept across preemptions."""
    enqueued_at: float
    """When the client request was added (aging counts from here)."""
    level: int | None = None
    """The urgency level it was admitted or resumed at (its priority minus aging then)."""
    admitted: bool = False

    def on_admitted(self, num_cached_tokens: int, now: float) -> None:
        """What the client is told is fixed at the first admission (a preempted request is admitted
        again): the prompt tokens found in the prefix cache, and the time it waited in the queue."""
        if not self.admitted:
            self.admitted = True
            self.req.num_cached_tokens = num_cached_tokens
            self.group.queue_seconds = now - self.enqueued_at


def sample_ids(req: Request) -> list[str]:
    return [f"{req.request_id}#{i}" for i in range(req.sampling.n)]


def split_samples(req: Request) -> SampleGroup:
    n = req.sampling.n
    if n == 1:
        return SampleGroup(req.request_id, [req])
    samples = []
    for i, sample_id in enumerate(sample_ids(req)):
        seed = None if req.sampling.seed is None else req.sampling.seed + i
        sampling = dataclasses.replace(req.sampling, n=1, seed=seed)
        samples.append(
            dataclasses.replace(
                req,
                request_id=sample_id,
                sampling=sampling,
                output_token_ids=[],
                block_ids=[],
                num_computed_tokens=0,
                num_cached_tokens=0,
            )
        )
    return SampleGroup(req.request_id, samples, pending=samples[1:])


def make_delta(
    req: Request, new_tokens: list[int], group: SampleGroup, index: int, logprobs: list[TokenLogprob] | None = None
) -> RequestDelta:
    """A sample's step result under its client-visible id and choice index."""
    return RequestDelta(
        request_id=group.client_id,
        new_token_ids=new_tokens,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=req.num_output_tokens,
        num_cached_tokens=req.num_cached_tokens,
        finish_reason=req.status.value if req.status.finished else None,
        index=index,
        logprobs=logprobs or [],
        queue_seconds=group.queue_seconds,
    )
