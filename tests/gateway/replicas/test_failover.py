"""The failover stream alone, with fake replicas: what moves, what does not, what is counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.engine_client import EngineDeadError
from gateway.replicas.counters import RoutingCounters
from gateway.replicas.failover import FailoverStream
from shared.protocol import AddRequest, Finished, TokenDelta, Usage
from shared.sampling import SamplingParams

pytestmark = pytest.mark.anyio
REQUEST = AddRequest("r", [1, 2, 3], SamplingParams(max_tokens=2))
TOKEN = TokenDelta("r", 0, [5], 3, 1, 0)
DONE = Finished("r", 0, "length", Usage(3, 1, 0))
ABORTED = Finished("r", 0, "abort", Usage(3, 0, 0))


class FakeStream:
    def __init__(self, items: list[Any]) -> None:
        self.items, self.closed, self.finished = items, False, False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if not self.items:
            self.finished = True
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class FakeReplica:
    address: str
    items: list[Any]
    streams: list[FakeStream] = field(default_factory=list)

    @property
    def client(self) -> FakeReplica:
        return self

    async def submit(self, request: AddRequest) -> FakeStream:
        self.streams.append(FakeStream(list(self.items)))
        return self.streams[-1]


@dataclass
class FakeRouter:
    replicas: list[FakeReplica]
    counters: RoutingCounters = field(default_factory=RoutingCounters)

    def pick(self, request: AddRequest, exclude: set[str]) -> FakeReplica | None:
        return next((r for r in self.replicas if r.address not in exclude), None)


async def run(router: FakeRouter) -> tuple[FailoverStream, list[Any]]:
    stream = FailoverStream(router, REQUEST)  # type: ignore[arg-type]
    await stream.open()
    return stream, [item async for item in stream]


async def test_an_abort_before_any_output_moves_the_request() -> None:
    first, second = FakeReplica("a", [ABORTED]), FakeReplica("b", [TOKEN, DONE])
    router = FakeRouter([first, second])
    stream, items = await run(router)
    assert items == [TOKEN, DONE] and stream.replica == "b"
    assert first.streams[0].closed and router.counters.retries == 1


async def test_a_loss_after_output_is_not_retried() -> None:
    router = FakeRouter([FakeReplica("a", [TOKEN, EngineDeadError("gone")]), FakeReplica("b", [TOKEN, DONE])])
    stream = FailoverStream(router, REQUEST)  # type: ignore[arg-type]
    await stream.open()
    assert await stream.__anext__() == TOKEN
    with pytest.raises(EngineDeadError, match="gone"):
        await stream.__anext__()
    assert router.counters.retries == 0 and router.counters.cut_by_replica_loss == 1
    assert router.replicas[1].streams == []


async def test_an_abort_after_output_passes_through() -> None:
    router = FakeRouter([FakeReplica("a", [TOKEN, ABORTED]), FakeReplica("b", [TOKEN, DONE])])
    _, items = await run(router)
    assert items == [TOKEN, ABORTED] and router.counters.retries == 0


async def test_each_replica_is_tried_once_then_the_loss_is_raised() -> None:
    router = FakeRouter([FakeReplica("a", [EngineDeadError("a died")]), FakeReplica("b", [EngineDeadError("b died")])])
    with pytest.raises(EngineDeadError, match="b died"):
        await run(router)
    assert router.counters.retries == 1 and router.counters.failovers_exhausted == 1


async def test_no_replica_at_all_is_engine_dead() -> None:
    with pytest.raises(EngineDeadError, match="no live engine replica"):
        await run(FakeRouter([]))
