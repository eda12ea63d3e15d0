"""EngineClient against a live engine loop (fake core, in a thread) and against scripted ROUTER sockets.

The same client against the real engine process and the real model: tests/engine/serving/test_server.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from gateway import engine_client
from gateway.engine_client import (
    EngineClient,
    EngineDeadError,
    EngineUnavailableError,
    RequestFailedError,
)
from shared.model_info import ModelInfo
from shared.protocol import (
    PROTOCOL_VERSION,
    AddRequest,
    Error,
    Finished,
    Hello,
    Ready,
    Stats,
    StepOutputs,
    TokenDelta,
    Usage,
    decode,
    encode,
)
from shared.sampling import SamplingParams
from tests.engine.serving.fake_core import Running, serving


@pytest.fixture
def engine() -> Iterator[Running]:
    with serving() as running:
        yield running


def add(rid: str, max_tokens: int = 4, prompt: list[int] | None = None) -> AddRequest:
    return AddRequest(rid, [5, 6, 7] if prompt is None else prompt, SamplingParams(max_tokens=max_tokens))


async def connected(address: str) -> EngineClient:
    client = EngineClient(address, gateway_id="test-gw", handshake_timeout=5.0)
    await client.start()
    return client


def test_handshake_gives_model_info_and_a_stream_yields_deltas_then_finished(engine: Running) -> None:
    async def main() -> tuple[ModelInfo, list[object], int]:
        client = await connected(engine.server.address)
        stream = await client.submit(add("r1", max_tokens=3))
        async with stream:
            items = [item async for item in stream]
        left = client.num_open_streams
        await client.close()
        return client.model_info, items, left

    info, items, left = asyncio.run(main())
    assert (info.model_name, info.max_model_len, info.block_size, info.num_blocks) == ("fake", 64, 4, 64)
    assert [i.new_token_ids for i in items if isinstance(i, TokenDelta)] == [[100], [101], [102]]
    last = items[-1]
    assert isinstance(last, Finished) and last.queue_seconds is not None and 0 <= last.queue_seconds < 5
    assert last == Finished("r1", 0, "length", Usage(3, 3, 0), last.queue_seconds)
    assert left == 0


def test_many_concurrent_streams_are_not_mixed(engine: Running) -> None:
    async def one(client: EngineClient, i: int) -> list[object]:
        async with await client.submit(add(f"req-{i}", max_tokens=3 + i % 4)) as stream:
            return [item async for item in stream]

    async def main() -> list[list[object]]:
        client = await connected(engine.server.address)
        results = await asyncio.gather(*(one(client, i) for i in range(24)))
        await client.close()
        return results

    for i, items in enumerate(asyncio.run(main())):
        assert {item.request_id for item in items} == {f"req-{i}"}  # type: ignore[attr-defined]
        assert len(items) == 3 + i % 4 + 1


def test_request_error_is_raised_from_the_stream_and_the_client_goes_on(engine: Running) -> None:
    async def main() -> tuple[str, list[object], bool]:
        client = await connected(engine.server.address)
        stream = await client.submit(add("long", prompt=[1] * 100))
        with pytest.raises(RequestFailedError) as e:
            async for _ in stream:
                pass
        after = [item async for item in await client.submit(add("ok", max_tokens=1))]
        healthy = client.healthy
        await client.close()
        return str(e.value), after, healthy

    message, after, healthy = asyncio.run(main())
    assert "the prompt has 100 tokens; the context is 64" in message
    assert isinstance(after[-1], Finished) and healthy


def test_leaving_a_stream_early_aborts_it_in_the_engine(engine: Running) -> None:
    async def main() -> int:
        client = await connected(engine.server.address)
        async with await client.submit(add("walkaway", max_tokens=1000)) as stream:
            async for _ in stream:
                break
        stats = await client.stats()
        for _ in range(50):  # the abort races the stats request only by one message
            if stats.num_running == 0:
                break
            await asyncio.sleep(0.02)
            stats = await client.stats()
        await client.close()
        return stats.num_running

    assert asyncio.run(main()) == 0
    assert engine.core.aborted == ["walkaway"]


def test_abort_ends_the_stream_with_an_abort_finish(engine: Running) -> None:
    async def main() -> list[object]:
        client = await connected(engine.server.address)
        stream = await client.submit(add("stopme", max_tokens=1000))
        items = [await stream.__anext__()]
        await client.abort("stopme")
        await client.abort("stopme")  # twice, and for unknown ids: harmless
        await client.abort("never-sent")
        items += [item async for item in stream]
        await client.close()
        return items

    items = asyncio.run(main())
    assert isinstance(items[-1], Finished) and items[-1].reason == "abort"
    assert items[-1].usage.completion_tokens == sum(isinstance(i, TokenDelta) for i in items)


def test_duplicate_request_id_is_refused_locally(engine: Running) -> None:
    async def main() -> None:
        client = await connected(engine.server.address)
        stream = await client.submit(add("same", max_tokens=50))
        with pytest.raises(ValueError, match="already in flight"):
            await client.submit(add("same"))
        await stream.aclose()
        await client.close()

    asyncio.run(main())


def test_engine_shutdown_fails_open_streams_and_later_submits(engine: Running) -> None:
    async def main() -> tuple[str, bool]:
        client = await connected(engine.server.address)
        stream = await client.submit(add("inflight", max_tokens=9000))
        await stream.__anext__()
        engine.server.request_stop()  # grace 0.2 s, then the engine aborts and tells every gateway
        refused = await client.submit(add("during-grace"))
        with pytest.raises(EngineDeadError, match="shutting down"):  # a 503 for the gateway, not a 500
            await refused.__anext__()
        with pytest.raises(EngineDeadError) as e:
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await client.submit(add("late"))
        healthy = client.healthy
        await client.close()
        return str(e.value), healthy

    message, healthy = asyncio.run(main())
    assert "shutting down" in message and not healthy
    engine.thread.join(5.0)
    assert engine.exit_code == [0]


def test_a_fatal_engine_error_reaches_the_stream(engine: Running) -> None:
    async def main() -> str:
        client = await connected(engine.server.address)
        engine.core.fail_next_step = RuntimeError("out of memory")
        stream = await client.submit(add("boom"))
        with pytest.raises(EngineDeadError) as e:
            async for _ in stream:
                pass
        await client.close()
        return str(e.value)

    assert asyncio.run(main()) == "engine error: engine failed: RuntimeError: out of memory"


def test_version_mismatch_is_refused_naming_both_versions(engine: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_client, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)

    async def main() -> None:
        client = EngineClient(engine.server.address, gateway_id="newer-gw")
        await client.start()

    with pytest.raises(EngineUnavailableError) as e:
        asyncio.run(main())
    assert f"the engine speaks version {PROTOCOL_VERSION}" in str(e.value)
    assert f"'newer-gw' speaks version {PROTOCOL_VERSION + 1}" in str(e.value)


def test_no_engine_means_a_handshake_timeout() -> None:
    from tests.support.redis_server import free_port

    async def main() -> None:
        client = EngineClient(f"tcp://127.0.0.1:{free_port()}", handshake_timeout=0.3)
        await client.start()

    with pytest.raises(EngineUnavailableError, match=r"no answer from the engine .* within 0.3 s"):
        asyncio.run(main())


class ScriptedEngine:
    """A bare ROUTER that answers Hello and then does what the test says, in a thread."""

    def __init__(self, ready_version: int = PROTOCOL_VERSION) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.ready_version = ready_version
        self.peer: bytes | None = None
        self.handshaken = threading.Event()
        self.thread = threading.Thread(target=self._handshake, daemon=True)
        self.thread.start()

    def _handshake(self) -> None:
        if self.sock.poll(5000):
            self.peer, frame = self.sock.recv_multipart()
            assert isinstance(decode(frame), Hello)
            self.sock.send_multipart([self.peer, encode(Ready(self.ready_version, ModelInfo("scripted", 32, 4, None, 8)))])
            self.handshaken.set()

    def send_raw(self, frame: bytes) -> None:
        assert self.peer is not None
        self.sock.send_multipart([self.peer, frame])

    def close(self) -> None:
        self.thread.join(5.0)
        self.sock.close(linger=0)
        self.ctx.term()


def test_a_ready_with_another_version_is_refused() -> None:
    scripted = ScriptedEngine(ready_version=PROTOCOL_VERSION + 5)

    async def main() -> None:
        await EngineClient(scripted.address, handshake_timeout=5.0).start()

    try:
        with pytest.raises(EngineUnavailableError, match=f"this gateway speaks {PROTOCOL_VERSION}.*speaks {PROTOCOL_VERSION + 5}"):
            asyncio.run(main())
    finally:
        scripted.close()


def test_garbage_from_the_engine_is_dropped_and_a_lost_connection_kills_the_client() -> None:
    scripted = ScriptedEngine()

    async def main() -> tuple[list[object], str, bool]:
        client = await connected(scripted.address)
        assert scripted.handshaken.wait(5.0)
        stream = await client.submit(add("r"))
        scripted.send_raw(b"\xc1garbage")
        scripted.send_raw(encode(StepOutputs([TokenDelta("r", 0, [9], 3, 1, 0)], [])))
        first = [await stream.__anext__()]
        scripted.sock.close(linger=0)  # the engine vanishes without a word
        with pytest.raises(EngineDeadError) as e:
            await asyncio.wait_for(stream.__anext__(), 5.0)
        healthy = client.healthy
        await client.close()
        return first, str(e.value), healthy

    try:
        first, message, healthy = asyncio.run(main())
    finally:
        scripted.thread.join(5.0)
        scripted.ctx.term()
    assert first == [TokenDelta("r", 0, [9], 3, 1, 0)]
    assert "lost the connection to the engine" in message and not healthy


def test_an_error_message_naming_no_request_does_not_kill_the_client() -> None:
    scripted = ScriptedEngine()

    async def main() -> tuple[bool, list[object]]:
        client = await connected(scripted.address)
        assert scripted.handshaken.wait(5.0)
        stream = await client.submit(add("r", max_tokens=1))
        scripted.send_raw(encode(Error(None, "request", "malformed message: whatever")))
        scripted.send_raw(encode(StepOutputs([], [Finished("r", 0, "stop", Usage(3, 0, 0))])))
        items = [item async for item in stream]
        healthy = client.healthy
        await client.close()
        return healthy, items

    try:
        healthy, items = asyncio.run(main())
    finally:
        scripted.close()
    assert healthy and items == [Finished("r", 0, "stop", Usage(3, 0, 0))]


def test_close_says_bye_and_the_engine_aborts_what_was_left_running(engine: Running) -> None:
    async def main() -> None:
        client = await connected(engine.server.address)
        stream = await client.submit(add("unfinished", max_tokens=9000))
        await stream.__anext__()
        await client.close()
        with pytest.raises(EngineDeadError, match="engine client closed"):
            await stream.__anext__()

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while engine.core.aborted != ["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.core.aborted == ["unfinished"]


def test_a_failing_reader_fails_the_streams_instead_of_leaving_them_waiting(engine: Running) -> None:
    async def main() -> tuple[str, bool]:
        client = await connected(engine.server.address)

        def broken_dispatch(msg: object) -> None:
            raise KeyError("a bug in routing")

        client._dispatch = broken_dispatch  # type: ignore[method-assign]
        stream = await client.submit(add("victim", max_tokens=3))
        with pytest.raises(EngineDeadError) as e:
            await asyncio.wait_for(stream.__anext__(), 5.0)
        healthy = client.healthy
        await client.close()
        return str(e.value), healthy

    message, healthy = asyncio.run(main())
    assert message == "engine client failed: KeyError: 'a bug in routing'" and not healthy


def test_a_timed_out_stats_call_does_not_shift_later_answers() -> None:
    scripted = ScriptedEngine()

    def stats(steps: int) -> Stats:
        return Stats(0, 0, 0, 8, 8, 0, steps, 0, 0, 0, 0.0, 1)

    async def main() -> int:
        client = await connected(scripted.address)
        assert scripted.handshaken.wait(5.0)
        with pytest.raises(TimeoutError):
            await client.stats(timeout=0.2)  # the engine is slow to answer this one
        second = asyncio.create_task(client.stats(timeout=5.0))
        await asyncio.sleep(0.2)
        scripted.send_raw(encode(stats(1)))  # the late answer to the first call: dropped
        scripted.send_raw(encode(stats(2)))  # the answer to the second
        result = await second
        await client.close()
        return result.num_steps

    try:
        assert asyncio.run(main()) == 2
    finally:
        scripted.close()
