"""The pipelined script channel: replies reach their own callers, and every failure is a 503-mapped one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ResponseError

from gateway.tenancy import TenancyUnavailable, connect
from gateway.tenancy.redis_conn import unavailable_on_failure
from gateway.tenancy.script_channel import Script, ScriptChannel

pytestmark = pytest.mark.anyio

ECHO = Script("return {ARGV[1], tonumber(ARGV[2]) * 2}")


@pytest.fixture
async def channel(redis_url: str) -> AsyncIterator[ScriptChannel]:
    client = connect(redis_url)
    ch = ScriptChannel.for_client(client)
    assert ch is not None
    yield ch
    await ch.aclose()
    await client.aclose()


async def test_concurrent_calls_share_one_connection_and_get_their_own_replies(channel, client):
    # The Redis server is shared with other test modules: count only connections opened from here on.
    newest_before = max(int(c["id"]) for c in await client.client_list())
    replies = await asyncio.gather(*(channel.run(ECHO, [f"call{i}", i]) for i in range(200)))
    assert replies == [[f"call{i}", 2 * i] for i in range(200)]
    opened = [c for c in await client.client_list() if int(c["id"]) > newest_before]
    assert [c["cmd"] for c in opened] == ["evalsha"]  # one pipelined connection carried all 200


async def test_a_script_redis_has_forgotten_is_loaded_again(channel, client):
    assert await channel.run(ECHO, ["a", 1]) == ["a", 2]
    await client.script_flush()
    assert await channel.run(ECHO, ["b", 2]) == ["b", 4]


async def test_an_error_reply_raises_response_error_and_the_channel_goes_on(channel):
    with pytest.raises(ResponseError, match="boom"):
        await channel.run(Script("return redis.error_reply('boom')"), [])
    assert await channel.run(ECHO, ["after", 3]) == ["after", 6]


async def test_a_dropped_connection_is_replaced_on_the_next_call(channel, client):
    assert await channel.run(ECHO, ["x", 1]) == ["x", 2]
    await client.client_kill_filter(_type="normal", skipme=True)  # the server drops the channel's socket
    for _ in range(100):  # the loop learns of the close as soon as it looks at the socket
        await asyncio.sleep(0.01)
        if channel._protocol is None or channel._protocol.closed:
            break
    assert await channel.run(ECHO, ["y", 2]) == ["y", 4]


async def test_the_client_s_db_is_selected(redis_url: str):
    base = redis_url.rsplit("/", 1)[0]
    client = connect(f"{base}/5")
    ch = ScriptChannel.for_client(client)
    assert ch is not None and ch.db == 5
    try:
        await ch.run(Script("redis.call('SET', ARGV[1], 'here') return 1"), ["channel-db-test"])
        assert await client.get("channel-db-test") == "here"  # the client is on db 5 too
        await client.delete("channel-db-test")
    finally:
        await ch.aclose()
        await client.aclose()


async def test_a_refused_auth_is_unavailable_not_a_crash(redis_url: str):
    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    ch = ScriptChannel(host, int(port), password="wrong")  # the test server has no password
    with pytest.raises(TenancyUnavailable), unavailable_on_failure():
        await ch.run(ECHO, ["x", 1])
    await ch.aclose()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    writers = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_is_unavailable_within_the_timeout():
    async with silent_server() as port:
        ch = ScriptChannel("127.0.0.1", port, timeout_s=0.2)
        calls = [asyncio.create_task(ch.run(ECHO, ["x", i])) for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        assert all(isinstance(r, TimeoutError | ConnectionError) for r in results), results
        with pytest.raises(TenancyUnavailable), unavailable_on_failure():
            await ch.run(ECHO, ["again", 1])  # a fresh connection, still no answer
        await ch.aclose()


async def test_nothing_listening_is_unavailable():
    ch = ScriptChannel("127.0.0.1", 1)
    with pytest.raises(TenancyUnavailable), unavailable_on_failure():
        await ch.run(ECHO, ["x", 1])
    await ch.aclose()


async def test_tls_clients_get_no_channel():
    client = connect("rediss://127.0.0.1:6390/0")
    assert ScriptChannel.for_client(client) is None  # admission falls back to redis-py's EVALSHA
    await client.aclose()


async def test_a_transport_that_is_not_an_asyncio_transport_subclass_works():
    """uvloop's TCPTransport (what uvicorn picks when uvloop is installed) does not subclass
    asyncio.Transport; the channel must take any object with the stream-transport methods."""
    from gateway.tenancy.script_channel import _Protocol

    class DuckTransport:
        def __init__(self) -> None:
            self.sent = b""

        def write(self, data: bytes) -> None:
            self.sent += data

        def close(self) -> None:
            pass

    proto, transport = _Protocol(), DuckTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    waiter = proto.send(("PING",))
    assert transport.sent == b"*1\r\n$4\r\nPING\r\n"
    proto.data_received(b"+PONG\r\n")
    assert await waiter == "PONG"
