"""The outputs of one request in flight, as the engine client (gateway/engine_client.py) hands them out.

    stream = await client.submit(AddRequest(...))
    async with stream:              # leaving early aborts the request in the engine
        async for item in stream:   # TokenDelta ..., one Finished per sample; then the iteration ends

The client's read loop puts each item (or an EngineError) on the stream's queue; the stream tells its
client to forget it once nothing more can come. It knows nothing about sockets or the wire format.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol

from gateway.engine_errors import EngineError
from shared.protocol import Finished, TokenDelta

StreamItem = TokenDelta | Finished


class StreamOwner(Protocol):
    """What a stream needs of its client (gateway/engine_client.py's EngineClient)."""

    async def abort(self, request_id: str) -> None: ...
    def _forget(self, request_id: str) -> None: ...


class RequestStream:
    """The outputs of one request, in order; built by EngineClient.submit()."""

    def __init__(self, client: StreamOwner, request_id: str, num_samples: int) -> None:
        self.request_id = request_id
        self.num_samples = num_samples
        self._client = client
        self._queue: asyncio.Queue[StreamItem | EngineError] = asyncio.Queue()
        self._num_finished = 0
        self._error: EngineError | None = None

    @property
    def finished(self) -> bool:
        """True once every sample finished or the request failed: nothing more will come."""
        return self._error is not None or self._num_finished == self.num_samples

    def _put(self, item: StreamItem | EngineError) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamItem:
        if self._error is not None:
            raise self._error
        if self._num_finished == self.num_samples:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, EngineError):
            self._error = item
            self._client._forget(self.request_id)
            raise item
        if isinstance(item, Finished):
            self._num_finished += 1
            if self._num_finished == self.num_samples:
                self._client._forget(self.request_id)
        return item

    async def aclose(self) -> None:
        """Abort the request in the engine unless it is over; stop routing its outputs."""
        if not self.finished:
            await self._client.abort(self.request_id)
        self._client._forget(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
