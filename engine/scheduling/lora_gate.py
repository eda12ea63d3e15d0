"""At most `max_loras` distinct LoRA adapters among the running requests, without starving any.

    running adapters {a, b} (max_loras 2)        queue: [ c1  a2  base3  c4  b5 ]
    admissible now:  a2, base3, b5 (their adapter runs, or none)      c1, c4: skipped, not blocking
    c1 skipped for lora_drain_s  ->  draining: a2 and b5 wait too, until a or b finishes and c joins

A request whose adapter's weights are still being read from disk (evicted from the host cache,
engine/worker/lora/evicted_reads.py) is passed over the same way until `release`, without
starting the drain clock: a read is not the cap, and holding others back would not shorten it.

Every running request gets a chunk each step, so bounding the running set's adapters bounds
every step's. A request is refused only for its adapter; the scheduler then looks past it
(FairQueue.peek's `eligible`), so tenants' fair share and priorities order everything else as
before. Base-model requests are never counted nor held back. Pure Python: knows adapter ids only.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.request import Request


class LoraGate:
    def __init__(self, max_loras: int, drain_s: float) -> None:
        self.max_loras, self.drain_s = max_loras, drain_s
        self._active: set[int] = set()
        self._skipped_since: dict[str, float] = {}  # request id -> when its adapter was first refused
        self._held: set[int] = set()  # adapter ids whose weights are not resident yet
        self._now = 0.0

    def begin_step(self, running: Iterable[Request], now: float) -> None:
        self._active = {r.lora_id for r in running if r.lora_id}
        self._now = now

    def admits(self, req: Request) -> bool:
        """May `req` start (or resume) this step? Records refusals (the drain rule's clock)."""
        if not req.lora_id:
            return True
        if req.lora_id in self._held:
            return False
        if req.lora_id in self._active:
            return req.request_id in self._skipped_since or not self._draining()
        if len(self._active) < self.max_loras:
            return True
        self._skipped_since.setdefault(req.request_id, self._now)
        return False

    def joined(self, req: Request) -> None:
        """`req` was admitted or resumed: its adapter runs from now on."""
        self._skipped_since.pop(req.request_id, None)
        if req.lora_id:
            self._active.add(req.lora_id)

    def hold(self, lora_id: int) -> None:
        """Requests under `lora_id` may not start until `release`: its weights are not in memory yet."""
        self._held.add(lora_id)

    def release(self, lora_id: int) -> None:
        self._held.discard(lora_id)

    def forget(self, req: Request) -> None:
        self._skipped_since.pop(req.request_id, None)

    @property
    def active(self) -> frozenset[int]:
        return frozenset(self._active)

    def _draining(self) -> bool:
        return any(self._now - since >= self.drain_s for since in self._skipped_since.values())
