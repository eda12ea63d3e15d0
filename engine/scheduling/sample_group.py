"""Parallel sampling (n > 1): one client request becomes n internal samples.

Sample i is a `Request` with id f"{client_id}#{i}" (the client id itself when
n == 1), `n=1`, and seed `seed + i` when a seed is given: so sample i produces
exactly what a lone request with seed `seed + i` produces. Sample 0 (the leader)
prefills the prompt; the others wait as `pending` until the leader's prompt KV is
written, then fork: they share its blocks covering the first P - 1 prompt tokens by
reference count and each recomputes only the last prompt token (to sample its own
first token), copying the shared partial block on that first write.

best_of > n: best_of samples run as above (each asks the runner for its sampled tokens' raw
logprobs) and nothing streams; when the last one ends, the n with the highest cumulative log
probability are sent whole as choices 0..n-1, the others' tokens counted as unreturned (usage).
Beam search: the samples are the beams (engine/scheduling/beam_group.py); they also send nothing
until the search ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.outputs import RequestDelta
from engine.request import Request
from engine.scheduling.beam_group import BeamSearch, Hypothesis
from shared.protocol import TokenLogprob


@dataclass(eq=False)
class SampleGroup:
    client_id: str
    samples: list[Request]
    pending: list[Request] = field(default_factory=list)
    """Samples waiting for the leader's prompt; they hold no blocks and no queue slot."""
    queue_seconds: float | None = None
    """From add_request to the leader's first admission (scheduler clock); None while never scheduled."""
    num_returned: int = 1
    """The client's n: choices 0..n-1."""
    beam: BeamSearch | None = None
    """Beam search's state; None for sampling."""
    client_logprobs: bool = False
    """A deferred group: whether the client asked for logprobs (the samples always ask, to rank)."""
    cumulative: dict[int, float] = field(default_factory=dict)
    """Deferred sampling: sample index -> the sum of its sampled tokens' raw logprobs."""
    buffered: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    """Deferred sampling with client logprobs: what each sample would have streamed."""

    @property
    def deferred(self) -> bool:
        """Nothing streams: the returned choices are known only at the end (best_of > n, beam search)."""
        return self.beam is not None or len(self.samples) > self.num_returned

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
    if req.sampling.num_candidates == 1 and not req.sampling.use_beam_search:
        return [req.request_id]
    return [f"{req.request_id}#{i}" for i in range(req.sampling.num_candidates)]


def split_samples(req: Request) -> SampleGroup:
    p = req.sampling
    if p.num_candidates == 1 and not p.use_beam_search:
        return SampleGroup(req.request_id, [req])
    beam = None
    if p.use_beam_search:
        beam = BeamSearch(p.beam_width, p.length_penalty, p.early_stopping, p.max_tokens)
        per_sample = dataclasses.replace(p, n=1, best_of=p.beam_width)
    elif p.num_candidates > p.n:  # best_of: every sample reports its sampled tokens' logprobs
        per_sample = dataclasses.replace(p, n=1, best_of=None, logprobs=p.logprobs or 0)
    else:
        per_sample = dataclasses.replace(p, n=1, best_of=None)
    samples = []
    for i, sample_id in enumerate(sample_ids(req)):
        seed = None if p.seed is None or beam else p.seed + i
        sampling = dataclasses.replace(per_sample, seed=seed)
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
    return SampleGroup(req.request_id, samples, pending=samples[1:], num_returned=p.n, beam=beam,
                       client_logprobs=p.logprobs is not None)


def token_deltas(state: SampleState, token: int, logprob: TokenLogprob | None) -> list[RequestDelta]:
    """What the client hears of a sample's new token: the token itself, or (best_of) nothing
    until the group's last sample ends, then the n best."""
    group = state.group
    if not group.deferred:
        return [make_delta(state.req, [token], group, state.index, None if logprob is None else [logprob])]
    note_deferred(group, state.index, logprob)
    return [] if group.live else best_of_deltas(group)


def note_deferred(group: SampleGroup, index: int, logprob: TokenLogprob | None) -> None:
    """A deferred sample's token: add its logprob to the sample's sum (and buffer it for the client)."""
    assert logprob is not None, "best_of samples always ask for their sampled tokens' logprobs"
    group.cumulative[index] = group.cumulative.get(index, 0.0) + logprob.logprob
    if group.client_logprobs:
        group.buffered.setdefault(index, []).append(logprob)


def best_of_deltas(group: SampleGroup) -> list[RequestDelta]:
    """All samples ended: the n with the highest cumulative logprob, whole, as choices 0..n-1."""
    ranked = sorted(range(len(group.samples)), key=lambda i: (-group.cumulative.get(i, 0.0), i))
    chosen = ranked[: group.num_returned]
    deltas = [make_delta(group.samples[i], list(group.samples[i].output_token_ids), group, rank,
                         group.buffered.get(i)) for rank, i in enumerate(chosen)]
    unreturned = sum(group.samples[i].num_output_tokens for i in ranked[group.num_returned :])
    return _with_unreturned(deltas, unreturned)


def beam_deltas(group: SampleGroup, hypotheses: list[Hypothesis]) -> list[RequestDelta]:
    """The search ended: its best n finished beams as choices 0..n-1, best first; the tokens the
    other beams generated count as unreturned (usage and the tenant's quota count every beam's)."""
    leader = group.leader
    assert group.beam is not None
    unreturned = max(group.beam.num_tokens - sum(len(h.token_ids) for h in hypotheses), 0)
    return _with_unreturned([
        RequestDelta(request_id=group.client_id, new_token_ids=list(h.token_ids),
                     num_prompt_tokens=leader.num_prompt_tokens, num_output_tokens=len(h.token_ids),
                     num_cached_tokens=leader.num_cached_tokens, finish_reason=h.finish_reason, index=rank,
                     queue_seconds=group.queue_seconds)
        for rank, h in enumerate(hypotheses)
    ], unreturned)


def abort_deltas(group: SampleGroup, aborted: list[Request]) -> list[RequestDelta]:
    """The aborted samples' last deltas; a deferred group's: each of the client's n choices ends
    (the samples are not the choices)."""
    if not group.deferred:
        return [make_delta(s, [], group, group.samples.index(s)) for s in aborted]
    leader = group.leader
    return [RequestDelta(group.client_id, [], leader.num_prompt_tokens, 0, leader.num_cached_tokens, "abort", i,
                         queue_seconds=group.queue_seconds) for i in range(group.num_returned)]


def _with_unreturned(deltas: list[RequestDelta], unreturned: int) -> list[RequestDelta]:
    if deltas and unreturned:
        deltas[0] = dataclasses.replace(deltas[0], num_unreturned_tokens=unreturned)
    return deltas


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
