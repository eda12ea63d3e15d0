"""The gateway's connection to the engine process: one ZeroMQ DEALER socket, asyncio.

Usage (the whole interface the rest of the gateway relies on):

    client = EngineClient("tcp://127.0.0.1:5555")      # gateway_id defaults to host-pid-random
    await client.start()            # connect + Hello/Ready handshake; raises EngineUnavailableError
                                    # on timeout or protocol version mismatch (message names both)
    client.model_info               # the ModelInfo carried by Ready: model_name, max_model_len, block_size,
                                    # eos_token_id, num_blocks, vocab_size, default_sampling
    client.healthy                  # False once the engine died or reported a fatal error

    stream = await client.submit(AddRequest(request_id, prompt_token_ids, sampling, ...))
    async with stream:              # leaving early (client disconnect, exception) aborts it
        async for item in stream:   # TokenDelta (new_token_ids, index, cumulative counts) ...
            ...                     # ... and one Finished(index, reason, usage) per sample;
                                    # the iteration ends after all `sampling.n` Finished items
    # Errors raised from the iterator:
    #   RequestFailedError  the engine refused or failed this request (bad input); others go on
    #   EngineDeadError     the engine is gone: every open stream gets it, and submit() too;
    #                       also a request refused because the engine is shutting down

    await client.abort(request_id)  # safe at any time; the stream then ends with Finished("abort")
    stats = await client.stats()    # shared.protocol.Stats (running, waiting, free blocks, ...);
                                    # TimeoutError after `timeout` (5 s) without an answer
    reply = await client.load_adapter(name, path)   # admin (issue 43): AdapterReply once it serves, or
    reply = await client.unload_adapter(name)       # why not (reply.error, reply.code); model_info follows
                                                    # the engine's ModelUpdate (sent before the reply)
    await client.close()            # says Bye (the engine aborts this gateway's requests);
                                    # open streams get EngineDeadError("engine client closed")

One background task reads everything the engine sends and routes each request's
outputs to that request's asyncio.Queue; a second watches the socket's monitor
so a dead engine (closed connection, or missed ZMTP heartbeats) is noticed even
while no request is open. This module knows the wire protocol and nothing about
HTTP, tokenizers or tenants.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.background_tasks import cancel_and_wait
from gateway.engine_errors import EngineDeadError, EngineError, EngineUnavailableError, RequestFailedError
from gateway.request_stream import RequestStream, StreamItem
from shared.curve import ClientKeys, connect_curve
from shared.model_info import ModelInfo
from shared.protocol import (
    PROTOCOL_VERSION,
    SHUTTING_DOWN,
    Abort,
    AdapterReply,
    AddRequest,
    Bye,
    Error,
    GetStats,
    Hello,
    LoadAdapter,
    Message,
    ModelUpdate,
    ProtocolError,
    Ready,
    Stats,
    StepOutputs,
    UnloadAdapter,
    decode,
    encode,
)

log = logging.getLogger("pageserve.engine_client")

__all__ = ["EngineClient", "EngineDeadError", "EngineError", "EngineUnavailableError", "RequestFailedError",
           "RequestStream", "StreamItem", "default_gateway_id"]

HEARTBEAT_IVL_MS = 1000
"""ZMTP pings run in libzmq's I/O thread, so a busy engine still answers them."""
HEARTBEAT_TIMEOUT_MS = 10_000


def default_gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class EngineClient:
    def __init__(self, address: str, gateway_id: str | None = None, *, handshake_timeout: float = 10.0,
                 curve: ClientKeys | None = None) -> None:
        self.address = address
        self._curve = curve
        """CURVE keys for an engine that requires them (shared/curve.py); None: plain TCP."""
        self.gateway_id = gateway_id or default_gateway_id()
        self.handshake_timeout = handshake_timeout
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: dict[str, RequestStream] = {}
        self._stats_waiters: collections.deque[asyncio.Future[Stats]] = collections.deque()
        self._adapter_calls: dict[str, asyncio.Future[AdapterReply]] = {}
        self._model_info: ModelInfo | None = None
        self._dead: EngineDeadError | None = None
        self.last_step = -1
        """The newest engine step counter seen in StepOutputs (the engine's heartbeat, gateway/engine_link.py)."""

    # ----------------------------------------------------------------- lifecycle

    @property
    def model_info(self) -> ModelInfo:
        if self._model_info is None:
            raise EngineUnavailableError("EngineClient.start() has not completed")
        return self._model_info

    @property
    def healthy(self) -> bool:
        return self._model_info is not None and self._dead is None

    async def start(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if self._curve is not None:
            connect_curve(sock, self._curve)
        self._sock = sock
        # The monitor exists before connect so that no connection event is missed.
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(self.address)
        await sock.send(encode(Hello(PROTOCOL_VERSION, self.gateway_id)))
        try:
            frames = await asyncio.wait_for(sock.recv_multipart(), self.handshake_timeout)
        except TimeoutError:
            await self.close()
            raise EngineUnavailableError(
                f"no answer from the engine at {self.address} within {self.handshake_timeout:g} s"
            ) from None
        reply = self._decode_handshake(frames)
        if isinstance(reply, Ready) and reply.protocol_version == PROTOCOL_VERSION:
            self._model_info = reply.model
        else:
            await self.close()
            raise EngineUnavailableError(self._handshake_refusal(reply))
        self._tasks = [asyncio.create_task(self._guarded(self._read_loop())),
                       asyncio.create_task(self._guarded(self._watch_loop()))]
        log.info("connected to engine at %s: model %s", self.address, reply.model.model_name)

    def _decode_handshake(self, frames: list[bytes]) -> Message | None:
        try:
            return decode(frames[-1])
        except ProtocolError as e:
            log.error("engine handshake reply is malformed: %s", e)
            return None

    def _handshake_refusal(self, reply: Message | None) -> str:
        if isinstance(reply, Error):
            return f"engine at {self.address} refused the connection: {reply.message}"
        if isinstance(reply, Ready):
            return (f"protocol version mismatch: this gateway speaks {PROTOCOL_VERSION}, "
                    f"the engine at {self.address} speaks {reply.protocol_version}")
        return f"engine at {self.address} sent no valid Ready message"

    async def close(self) -> None:
        """Say Bye (the engine aborts this gateway's requests at once) and release everything."""
        linger_ms = 0
        if self.healthy and self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(encode(Bye("client closed")), zmq.NOBLOCK)
                linger_ms = 200  # time to flush the Bye, spent only when the engine is there
        self._fail_all(EngineDeadError("engine client closed"))
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self._sock.close(linger=linger_ms)
            self._sock = None
        self._ctx.term()

    # ----------------------------------------------------------------- requests

    async def submit(self, request: AddRequest) -> RequestStream:
        """Send the request; its outputs arrive through the returned stream."""
        self._check_alive()
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        frame = encode(request)  # before the stream exists: a value the encoder refuses leaves nothing behind
        stream = RequestStream(self, request.request_id, request.sampling.n)
        self._streams[request.request_id] = stream
        assert self._sock is not None
        await self._sock.send(frame)
        return stream

    async def abort(self, request_id: str) -> None:
        """Ask the engine to stop a request; a no-op for unknown or finished ones, or a dead engine."""
        stream = self._streams.get(request_id)
        if stream is None or stream.finished or self._dead is not None:
            return
        await self._send(Abort([request_id]))

    async def stats(self, timeout: float = 5.0) -> Stats:
        self._check_alive()
        waiter: asyncio.Future[Stats] = asyncio.get_running_loop().create_future()
        # Answers come back in order on one connection, so waiters are matched first in, first out;
        # a waiter cancelled by the timeout stays queued and its late answer is dropped.
        self._stats_waiters.append(waiter)
        await self._send(GetStats())
        return await asyncio.wait_for(waiter, timeout)

    async def load_adapter(self, name: str, path: str, timeout: float = 120.0) -> AdapterReply:
        """Load (or reload) a LoRA adapter from a folder on the engine's host; answered once it serves."""
        return await self._adapter_call(lambda call_id: LoadAdapter(call_id, name, path), timeout)

    async def unload_adapter(self, name: str, timeout: float = 30.0) -> AdapterReply:
        return await self._adapter_call(lambda call_id: UnloadAdapter(call_id, name), timeout)

    async def _adapter_call(self, make: Callable[[str], LoadAdapter | UnloadAdapter], timeout: float) -> AdapterReply:
        self._check_alive()
        call_id = uuid.uuid4().hex
        waiter: asyncio.Future[AdapterReply] = asyncio.get_running_loop().create_future()
        self._adapter_calls[call_id] = waiter
        try:
            await self._send(make(call_id))
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._adapter_calls.pop(call_id, None)

    def fail(self, reason: str) -> None:
        """Give up on the engine (it stalled, or this gateway is stopping): every open stream gets
        EngineDeadError(reason) and the client is unhealthy from now on."""
        self._fail_all(EngineDeadError(reason))

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._model_info is None or self._sock is None:
            raise EngineUnavailableError("EngineClient.start() has not completed")

    async def _send(self, msg: Message) -> None:
        assert self._sock is not None
        await self._sock.send(encode(msg))

    # ----------------------------------------------------------------- background tasks

    async def _guarded(self, loop: Coroutine[Any, Any, None]) -> None:
        """A background task that dies must not leave streams waiting forever: fail them all."""
        try:
            await loop
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("engine client background task failed")
            self._fail_all(EngineDeadError(f"engine client failed: {type(e).__name__}: {e}"))

    async def _read_loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            try:
                msg = decode(frames[-1])
            except ProtocolError as e:  # never let one bad frame take the gateway down
                log.error("dropping malformed frame from the engine: %s", e)
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, StepOutputs):
            self.last_step = max(self.last_step, msg.step)
            for delta in msg.deltas:
                self._route(delta.request_id, delta)
            for fin in msg.finished:
                self._route(fin.request_id, fin)
        elif isinstance(msg, Error):
            self._on_error(msg)
        elif isinstance(msg, ModelUpdate):  # adapters loaded or unloaded: the catalog follows at once
            self._model_info = msg.model
        elif isinstance(msg, AdapterReply):
            call = self._adapter_calls.pop(msg.call_id, None)
            if call is not None and not call.done():
                call.set_result(msg)
        elif isinstance(msg, Stats):
            # Exactly one answer per GetStats, in order: the oldest waiter's, even if it gave up waiting.
            if self._stats_waiters:
                waiter = self._stats_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(msg)
        else:
            log.warning("unexpected %s from the engine ignored", type(msg).__name__)

    def _route(self, request_id: str, item: StreamItem | EngineError) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:  # outputs of an aborted, forgotten request are dropped
            stream._put(item)

    def _on_error(self, err: Error) -> None:
        if err.kind == "engine":
            log.error("engine reported a fatal error: %s", err.message)
            self._fail_all(EngineDeadError(f"engine error: {err.message}"))
        elif err.request_id is not None and err.code == SHUTTING_DOWN:
            self._route(err.request_id, EngineDeadError(err.message))  # not this request's fault: a 503
        elif err.request_id is not None:
            self._route(err.request_id, RequestFailedError(err.message, err.code, err.param))
        else:
            log.error("engine error about no request: %s", err.message)

    async def _watch_loop(self) -> None:
        assert self._monitor is not None
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                log.error("lost the connection to the engine at %s", self.address)
                self._fail_all(EngineDeadError(f"lost the connection to the engine at {self.address}"))
                return

    def _fail_all(self, error: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = error
        for stream in list(self._streams.values()):
            stream._put(error)
        self._streams.clear()
        waiters: list[asyncio.Future[Any]] = [*self._stats_waiters, *self._adapter_calls.values()]
        self._stats_waiters.clear()
        self._adapter_calls.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
