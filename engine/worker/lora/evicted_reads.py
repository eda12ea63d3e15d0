"""Requests whose adapter was evicted from the host cache wait while its folder is read off the loop.

    add_request(r, load 7 evicted) ─> wait(7, r) ─> reader thread: registry.reread(7)()
      the scheduler passes r over (LoraGate.hold)     │ done: wakes the loop
    next step, on the loop: finished() ──────────────┴─> ready [7]: resident, LoraGate.release(7)
                                                         failed [(7, [r], error)]: fail r, the rest go on

One read per load however many requests wait for it. A read that fails (the folder changed
since the load, a file vanished, the reader's own error) fails only the requests waiting on
that load. Runs on the step loop except the read itself; knows nothing about the scheduler
beyond the load ids and client request ids it is given.
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass, field

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.reader import LoraReader
from engine.worker.lora.registry import LoraRegistry

log = logging.getLogger("pageserve.engine")


@dataclass
class _Read:
    future: concurrent.futures.Future[tuple[LoraAdapter, float]]
    request_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FailedRead:
    load_id: int
    request_ids: list[str]
    """The client request ids that waited on it."""
    message: str


class EvictedReads:
    def __init__(self, registry: LoraRegistry, reader: LoraReader) -> None:
        self._registry, self._reader = registry, reader
        self._reads: dict[int, _Read] = {}  # load id -> its read in flight, oldest first
        self.reads = 0
        """Reads started (tests count them)."""

    def wait(self, load_id: int, request_id: str) -> bool:
        """`request_id` runs under `load_id`: start reading it if it is evicted and no read is under way.
        Returns whether the request must wait for the read."""
        read = self._reads.get(load_id)
        if read is None:
            if self._registry.is_resident(load_id):
                return False
            read = self._reads[load_id] = _Read(self._reader.submit(self._registry.reread(load_id)))
            self.reads += 1
        read.request_ids.append(request_id)
        return True

    def pending(self) -> bool:
        return bool(self._reads)

    def finished(self) -> tuple[list[int], list[FailedRead]]:
        """Reads done since the last call: the loads now resident, and the failed ones with their waiters."""
        ready: list[int] = []
        failed: list[FailedRead] = []
        for load_id in [i for i, r in self._reads.items() if r.future.done()]:
            read = self._reads.pop(load_id)
            try:
                adapter, seconds = read.future.result()
            except Exception as e:  # noqa: BLE001 (a LoraError, or the reader's own failure: these requests only)
                log.warning("re-reading evicted LoRA load %d failed: %s", load_id, e)
                failed.append(FailedRead(load_id, read.request_ids, f"loading the adapter failed: {e}"))
                continue
            self._registry.reinstall(adapter, seconds)
            ready.append(load_id)
        return ready, failed
