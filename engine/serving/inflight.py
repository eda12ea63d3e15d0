"""The engine server's table of requests in flight: who asked for each, and what to tell them.

    request id ──> gateway identity, prompt length, unfinished sample indices, last counts

It turns the core's RequestDeltas into wire entries (TokenDelta, Finished with
usage and the time queued) grouped by the gateway that sent each request, and logs one line per
finished request (ids and counts only: never prompts). Plain Python: no zmq, no
torch, nothing about how the core computes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.outputs import RequestDelta
from shared.protocol import AddRequest, Finished, FinishReason, PriorityLoad, TenantLoad, TokenDelta, Usage

log = logging.getLogger("pageserve.engine")

PerGateway = dict[bytes, tuple[list[TokenDelta], list[Finished]]]
"""One step's outputs, grouped by gateway identity: what becomes one StepOutputs message each."""


@dataclass
class _Entry:
    gateway: bytes
    num_prompt_tokens: int
    unfinished: set[int]
    """Sample indices that have not finished yet."""
    tenant_id: str
    added_at: float
    """time.monotonic() when the engine accepted it (the finish line's latency)."""
    first_token_at: float | None = None
    """time.monotonic() of the first generated token (time to first token, in the finish line)."""
    num_output: dict[int, int] = field(default_factory=dict)
    num_cached: int = 0
    priority: int = 0
    queue_seconds: float | None = None
    """From the engine's arrival to the first scheduling, once the core reported it."""


class InFlightTable:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.num_finished = 0
        """Requests whose every sample finished (any reason) since start."""
        self.tokens_by_tenant: dict[str, int] = {}
        """Tokens generated per tenant since start (Stats.by_tenant: fair share on /metrics)."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        return list(self._entries)

    def add(self, add: AddRequest, gateway: bytes) -> None:
        assert add.request_id not in self._entries, add.request_id
        self._entries[add.request_id] = _Entry(gateway, len(add.prompt_token_ids), set(range(add.sampling.n)),
                                               add.tenant_id, time.monotonic(), priority=add.priority)

    def owned(self, gateway: bytes, request_ids: Iterable[str]) -> list[str]:
        """The ids among these that are in flight and were sent by this gateway."""
        return [rid for rid in request_ids if rid in self._entries and self._entries[rid].gateway == gateway]

    def added_before(self, cutoff: float) -> list[str]:
        """Requests accepted before `cutoff` (time.monotonic()) and still in flight."""
        return [rid for rid, e in self._entries.items() if e.added_at < cutoff]

    def gateway_of(self, request_id: str) -> bytes | None:
        entry = self._entries.get(request_id)
        return None if entry is None else entry.gateway

    def of_gateway(self, gateway: bytes) -> list[str]:
        return [rid for rid, entry in self._entries.items() if entry.gateway == gateway]

    def route(self, deltas: list[RequestDelta]) -> PerGateway:
        """Wire entries for one step's deltas; requests that finish here leave the table."""
        out: PerGateway = {}
        for d in deltas:
            entry = self._entries.get(d.request_id)
            if entry is None:
                continue  # aborted earlier: its gateway was already told
            token_deltas, finished = out.setdefault(entry.gateway, ([], []))
            entry.num_output[d.index] = d.num_output_tokens
            entry.num_cached = d.num_cached_tokens
            if d.queue_seconds is not None:
                entry.queue_seconds = d.queue_seconds
            if d.new_token_ids:
                self.tokens_by_tenant[entry.tenant_id] = self.tokens_by_tenant.get(entry.tenant_id, 0) + len(
                    d.new_token_ids) + d.num_unreturned_tokens
                if entry.first_token_at is None:
                    entry.first_token_at = time.monotonic()
                token_deltas.append(TokenDelta(d.request_id, d.index, list(d.new_token_ids), d.num_prompt_tokens,
                                               d.num_output_tokens, d.num_cached_tokens, list(d.logprobs),
                                               list(d.prompt_logprobs), d.num_unreturned_tokens))
            if d.finish_reason is not None:
                finished.append(self._finish_one(d.request_id, d.index, d.finish_reason))  # type: ignore[arg-type]
        return out

    def loads(self) -> tuple[list[PriorityLoad], list[TenantLoad]]:
        """Requests in flight by priority (queued: no token yet) and by tenant, with tokens per tenant."""
        by_priority: dict[int, list[int]] = {}
        in_flight: dict[str, int] = {}
        for e in self._entries.values():
            counts = by_priority.setdefault(e.priority, [0, 0])
            counts[e.first_token_at is not None] += 1
            in_flight[e.tenant_id] = in_flight.get(e.tenant_id, 0) + 1
        tenants = sorted(set(in_flight) | set(self.tokens_by_tenant))
        return ([PriorityLoad(p, q, r) for p, (q, r) in sorted(by_priority.items())],
                [TenantLoad(t, in_flight.get(t, 0), self.tokens_by_tenant.get(t, 0)) for t in tenants])

    def finish_all(self, request_id: str, reason: FinishReason) -> list[Finished]:
        """End every unfinished sample of a request (abort): its Finished entries, with usage so far."""
        return [self._finish_one(request_id, i, reason) for i in sorted(self._entries[request_id].unfinished)]

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget requests nobody will hear about (their gateway is gone, or the engine is stopping)."""
        for rid in request_ids:
            del self._entries[rid]

    def _finish_one(self, request_id: str, index: int, reason: FinishReason) -> Finished:
        entry = self._entries[request_id]
        entry.unfinished.discard(index)
        fin = Finished(request_id, index, reason,
                       Usage(entry.num_prompt_tokens, entry.num_output.get(index, 0), entry.num_cached),
                       entry.queue_seconds)
        if not entry.unfinished:
            del self._entries[request_id]
            self.num_finished += 1
            ttft = "-" if entry.first_token_at is None else f"{entry.first_token_at - entry.added_at:.2f} s"
            log.info("request %s (tenant %s) finished (%s) in %.2f s, first token %s: prompt %d, output %d, "
                     "cached %d tokens", request_id, entry.tenant_id or "-", reason,
                     time.monotonic() - entry.added_at, ttft, entry.num_prompt_tokens,
                     sum(entry.num_output.values()), entry.num_cached)
        return fin
