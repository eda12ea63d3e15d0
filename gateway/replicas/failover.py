"""One request's outputs across replicas: moved to another replica while nothing was sent.

    open() ──> router.pick (a replica not tried yet) ──> that replica's RequestStream
    the replica dies, is evicted (stalled), refuses (shutting down) or aborts the request
        nothing yielded yet ──> open() again on another replica (counted as a retry)
        something yielded   ──> EngineDeadError: the generation ends with a clear 503 and settles
    no replica left to try  ──> EngineDeadError

Retrying is safe only before the first output: the client has seen nothing,
and the engine that lost the request freed its blocks (it died, or it aborted
the request itself). The same request id is reused: ids are unique per gateway
connection, and a replica never sees the id twice. It knows nothing about HTTP
or how the replica is chosen (router.py, policy.py).
"""

from __future__ import annotations

import logging
from typing import Protocol

from gateway.engine_client import EngineDeadError, RequestStream
from gateway.replicas.counters import RoutingCounters
from shared.protocol import AddRequest, Finished, TokenDelta

log = logging.getLogger("pageserve.gateway")


class Submitter(Protocol):
    async def submit(self, request: AddRequest) -> RequestStream: ...


class Endpoint(Protocol):
    """A replica as far as failover needs it (replica.py's Replica)."""

    @property
    def address(self) -> str: ...
    @property
    def client(self) -> Submitter: ...


class Picker(Protocol):
    """The router (router.py): chooses a replica and keeps the counters."""

    @property
    def counters(self) -> RoutingCounters: ...
    def pick(self, request: AddRequest, exclude: set[str]) -> Endpoint | None: ...


class FailoverStream:
    def __init__(self, router: Picker, request: AddRequest) -> None:
        self.request_id = request.request_id
        self.num_samples = request.sampling.n
        self._router = router
        self._request = request
        self._stream: RequestStream | None = None
        self._tried: list[str] = []
        self._yielded = False

    @property
    def replica(self) -> str | None:
        """The address of the replica serving the request now."""
        return self._tried[-1] if self._tried else None

    @property
    def finished(self) -> bool:
        return self._stream is not None and self._stream.finished

    async def open(self, lost: EngineDeadError | None = None) -> None:
        """Submit to the best replica not tried yet; after a loss (`lost`) that is a retry.

        Raises `lost` (or EngineDeadError) when no live replica is left to try."""
        error = lost
        while True:
            replica = self._router.pick(self._request, exclude=set(self._tried))
            if replica is None:
                if lost is not None:
                    self._router.counters.failover_exhausted()
                raise error or EngineDeadError("no live engine replica")
            self._tried.append(replica.address)
            try:
                self._stream = await replica.client.submit(self._request)
            except EngineDeadError as e:  # died between the probe and now: the next one
                error = e
                continue
            if lost is not None:
                self._router.counters.retried()
                log.warning("request %s moved to replica %s: %s", self.request_id, replica.address, lost)
            return

    def __aiter__(self) -> FailoverStream:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        while True:
            assert self._stream is not None, "open() first"
            try:
                item = await self._stream.__anext__()
            except EngineDeadError as e:
                if self._yielded:
                    self._router.counters.cut()
                    raise
                await self.open(lost=e)
                continue
            if not self._yielded and isinstance(item, Finished) and item.reason == "abort":
                # We never abort a stream we still read: the replica gave up on it (shutting down).
                await self._stream.aclose()
                await self.open(lost=EngineDeadError(f"replica {self.replica} aborted the request"))
                continue
            self._yielded = True
            return item

    async def aclose(self) -> None:
        """Abort the request on its current replica unless it is over."""
        if self._stream is not None:
            await self._stream.aclose()
