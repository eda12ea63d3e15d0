"""One pipelined Redis connection for the admission scripts every request runs.

Why not redis-py here: on this path it spends about 0.12 ms of CPU per command
(a pool checkout under a lock and a timer, a task per write for its timeout, a
read timeout, event hooks), several times the loopback round trip itself, and
on a busy host that CPU is latency (`pageserve bench admission` measures it).
Redis runs commands one at a time and answers a connection in order, so one
connection carries all of a process's calls: a call writes its command at once
and its future is resolved by the next reply in line (RESP parsed by hiredis).

    channel = ScriptChannel.for_client(redis)    # the client's address, credentials and db;
                                                 # None for TLS (keep using redis-py there)
    reply = await channel.run(script, args)      # EVALSHA; on NOSCRIPT loads the script and retries
    await channel.aclose()

Failures raise what `redis_conn.unavailable_on_failure` turns into TenancyUnavailable:
a refused connection, a lost one (every waiting call fails at once), no reply
within the client's socket timeout (the connection is dropped and the next call
reconnects), a refused AUTH or SELECT. An error reply raises redis-py's
ResponseError, as redis-py would. Nothing here knows what the scripts do.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError


@dataclass(frozen=True)
class Script:
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


class _Protocol(asyncio.Protocol):
    """The socket: commands out as they come, replies to the oldest waiter."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, but not always a subclass of asyncio.Transport (uvloop's TCPTransport isn't).
        self.transport = cast(asyncio.Transport, transport)

    def send(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.transport.write(hiredis.pack_command(args))
        return waiter

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                waiter = self.waiters.popleft()
                if not waiter.done():  # else its caller gave up; replies stay in order all the same
                    waiter.set_result(reply)
        except hiredis.ProtocolError:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("lost the connection to Redis"))


class ScriptChannel:
    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, path: str | None = None, db: int = 0,
                 username: str | None = None, password: str | None = None, timeout_s: float = 2.0,
                 connect_timeout_s: float = 1.0) -> None:
        self.host, self.port, self.path, self.db = host, port, path, db
        self._credentials = [x for x in (username, password) if x] if password else []
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    @classmethod
    def for_client(cls, client: aioredis.Redis) -> ScriptChannel | None:
        """A channel to the same server as `client` (plain TCP or a Unix socket), or None for TLS."""
        pool = client.connection_pool
        kw = pool.connection_kwargs
        common: dict[str, Any] = {"db": int(kw.get("db") or 0), "username": kw.get("username"),
                                  "password": kw.get("password"),
                                  "timeout_s": kw.get("socket_timeout") or 2.0,
                                  "connect_timeout_s": kw.get("socket_connect_timeout") or 1.0}
        if pool.connection_class is aioredis.Connection:
            return cls(kw.get("host", "localhost"), int(kw.get("port", 6379)), **common)
        if pool.connection_class is aioredis.UnixDomainSocketConnection:
            return cls(path=kw["path"], **common)
        return None

    async def run(self, script: Script, args: list[Any]) -> Any:
        """EVALSHA the script with no KEYS and these ARGV; SCRIPT LOAD it first if Redis lacks it."""
        try:
            return await self._call("EVALSHA", script.sha, 0, *args)
        except ResponseError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
        await self._call("SCRIPT", "LOAD", script.source)
        return await self._call("EVALSHA", script.sha, 0, *args)

    async def _call(self, *args: Any) -> Any:
        protocol = await self._connected()
        reply = await self._await(protocol, protocol.send(args))
        if isinstance(reply, ResponseError):
            if str(reply).startswith("LOADING"):  # a restarted Redis still reading its file: unreachable for now
                raise BusyLoadingError(str(reply))
            raise reply
        return reply

    async def _await(self, protocol: _Protocol, waiter: asyncio.Future[Any]) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await waiter
        except TimeoutError:
            protocol.close()  # a server that does not answer: drop it, the next call reconnects
            raise

    async def _connected(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self._protocol is not None and not self._protocol.closed and self._loop is loop:
            return self._protocol
        if self._loop is not loop:  # first use, or a new event loop (the old connection died with its loop)
            self._loop, self._protocol, self._connecting = loop, None, asyncio.Lock()
        assert self._connecting is not None
        async with self._connecting:  # concurrent first calls share one connection
            if self._protocol is None or self._protocol.closed:
                self._protocol = await self._connect(loop)
        return self._protocol

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        async with asyncio.timeout(self.connect_timeout_s):
            if self.path is not None:
                _, protocol = await loop.create_unix_connection(_Protocol, self.path)
            else:
                _, protocol = await loop.create_connection(_Protocol, self.host, self.port)
            handshake = ([("AUTH", *self._credentials)] if self._credentials else []) + (
                [("SELECT", self.db)] if self.db else [])
            try:
                for command in handshake:
                    reply = await protocol.send(command)
                    if isinstance(reply, ResponseError):
                        raise RedisConnectionError(f"Redis refused {command[0]}: {reply}")
            except BaseException:
                protocol.close()
                raise
        return protocol

    async def aclose(self) -> None:
        if self._protocol is not None and not self._protocol.closed:
            self._protocol.close()
        self._protocol = None
