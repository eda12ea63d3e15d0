"""The waiting queue: priority with aging, weighted fair share between tenants, then arrival.

Owns the order in which queued requests are admitted; it knows nothing about
blocks or the model. Order ("priority" policy), smallest first:

    (effective level, tenant's normalized service, arrival)
    effective level = priority - floor(aging_rate * seconds waited)     lower = more urgent

Within one level, tenants are served by start-time fair queuing over token cost:
every token the scheduler computes for a tenant (prompt chunks and decodes, while
queued or running) adds 1 / weight to that tenant's virtual time, and the tenant
with the smallest virtual time is admitted next. A tenant that becomes backlogged
starts at the smallest virtual time among the backlogged ones (or, when none is, at
the virtual time of the tenant admitted last), so idling earns no credit. With "fcfs" the order is arrival alone.

Requests sit in one heap per (priority, tenant) class ordered by arrival; only the
heads compete, so a pick costs O(classes), not O(queue).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.request import Request


def aged_level(priority: int, enqueued_at: float, now: float, aging_rate: float) -> int:
    """A queued request's effective priority: one level more urgent per 1 / aging_rate s waited."""
    return priority - math.floor(aging_rate * max(now - enqueued_at, 0.0))


@dataclass(order=True)
class _Entry:
    seq: int
    enqueued_at: float = field(compare=False)
    req: Request = field(compare=False)


class FairQueue:
    def __init__(self, policy: str, aging_rate: float) -> None:
        self.policy = policy
        self.aging_rate = aging_rate
        self._classes: dict[tuple[int, str], list[_Entry]] = {}
        self._entries: dict[str, tuple[tuple[int, str], _Entry]] = {}
        self._vtime: dict[str, float] = {}
        self._backlog: dict[str, int] = {}  # tenant -> queued requests
        self._vclock = 0.0  # virtual time of the tenant admitted last: where newcomers start

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (entry.req for _, entry in self._entries.values())

    def __contains__(self, req: Request) -> bool:
        return req.request_id in self._entries

    def push(self, req: Request, seq: int, enqueued_at: float) -> None:
        """Queue a request; `seq` is its arrival order, kept across preemptions."""
        assert req.request_id not in self._entries
        key = self._class_of(req)
        entry = _Entry(seq, enqueued_at, req)
        heapq.heappush(self._classes.setdefault(key, []), entry)
        self._entries[req.request_id] = (key, entry)
        tenant = req.tenant_id
        if not self._backlog.get(tenant):
            others = [self._vtime.get(t, 0.0) for t, n in self._backlog.items() if n and t != tenant]
            floor = min(others, default=self._vclock)
            self._vtime[tenant] = max(self._vtime.get(tenant, 0.0), floor)
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1

    def peek(self, now: float, eligible: Callable[[Request], bool] | None = None) -> Request | None:
        """The next request to admit; with `eligible`, the first in order that it accepts (a request
        refused for its LoRA adapter is looked past: engine/scheduling/lora_gate.py). The heads are
        tried first; only when the best head is refused are the classes searched in order."""
        best: tuple[tuple[float, ...], Request] | None = None
        for heap in self._classes.values():
            entry = heap[0]
            key = self._order_key(entry, now)
            if best is None or key < best[0]:
                best = (key, entry.req)
        if best is None or eligible is None or eligible(best[1]):
            return None if best is None else best[1]
        ordered = sorted((self._order_key(e, now), e.seq, e.req) for heap in self._classes.values() for e in heap)
        return next((req for _, _, req in ordered if eligible(req)), None)

    def level(self, req: Request, now: float) -> int:
        """Effective priority level of a queued request (aging applied)."""
        _, entry = self._entries[req.request_id]
        return self._level(entry, now)

    def remove(self, req: Request) -> bool:
        """Take a request out (admitted or aborted); False if it was not queued."""
        found = self._entries.pop(req.request_id, None)
        if found is None:
            return False
        key, entry = found
        heap = self._classes[key]
        if heap[0] is entry:
            heapq.heappop(heap)
        else:
            heap.remove(entry)
            heapq.heapify(heap)
        if not heap:
            del self._classes[key]
        self._backlog[req.tenant_id] -= 1
        return True

    def admit(self, req: Request) -> None:
        """Take the request out for admission; its tenant's virtual time becomes the clock."""
        assert self.remove(req), f"{req.request_id} is not queued"
        self._vclock = self._vtime.get(req.tenant_id, 0.0)

    def charge(self, req: Request, num_tokens: int) -> None:
        """Account tokens computed for the request's tenant (weights come with the request)."""
        self._vtime[req.tenant_id] = self._vtime.get(req.tenant_id, 0.0) + num_tokens / req.weight

    def virtual_time(self, tenant_id: str) -> float:
        return self._vtime.get(tenant_id, 0.0)

    def _class_of(self, req: Request) -> tuple[int, str]:
        return (req.priority, req.tenant_id) if self.policy == "priority" else (0, "")

    def _level(self, entry: _Entry, now: float) -> int:
        if self.policy != "priority":
            return 0
        return aged_level(entry.req.priority, entry.enqueued_at, now, self.aging_rate)

    def _order_key(self, entry: _Entry, now: float) -> tuple[float, ...]:
        if self.policy != "priority":
            return (entry.seq,)
        return (self._level(entry, now), self._vtime.get(entry.req.tenant_id, 0.0), entry.seq)
