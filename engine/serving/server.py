"""The engine process: one ZeroMQ ROUTER socket in front of one EngineCore.

    gateway A (DEALER) ──┐                     ┌─ drain every pending message (never blocks)
    gateway B (DEALER) ──┼── ROUTER  ── loop ──┼─ core.step()            while there is work
    gateway C (DEALER) ──┘   (identity)        └─ one StepOutputs per gateway per step
                                                when idle: block in poll (no spinning)

Gateways are told apart by their ZeroMQ routing identity; every request remembers
the identity that sent it, so outputs go back only there. Messages are drained
before each step, so an Abort always takes effect before the next step. A
malformed or unexpected message is logged and answered with an Error; the loop
goes on. A step that fails for reasons of its requests (engine/step_failures.py)
fails those requests only (Error kind "request", code REQUEST_FAILED); any other
exception from the core is fatal: every gateway is told (Error kind "engine") and
the process exits 1. SIGTERM/SIGINT stop admissions (new
requests get an Error with code SHUTTING_DOWN), give in-flight requests
`shutdown_grace_s` to finish, abort the rest, tell every gateway, and exit 0.
A gateway that says Bye, or whose connection is gone (the next send to it
fails), is forgotten and its requests are aborted. LoadAdapter/UnloadAdapter (admin,
engine/serving/lora_calls.py) read adapters off the loop and swap them on it;
a change is told to every gateway (ModelUpdate) before the caller's reply.

This module owns the loop and the process lifecycle (the in-flight table in
engine/serving/inflight.py does the per-request bookkeeping, router_socket.py
configures the socket, server_config.py holds the settings and the core's
contract); it knows neither
tokenizers nor HTTP, and nothing about how the core schedules or computes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable

import zmq

from engine.request import Request
from engine.serving.inflight import InFlightTable
from engine.serving.lora_calls import LoraCalls
from engine.serving.router_socket import open_router
from engine.serving.server_config import MAX_MESSAGE_BYTES, CoreLike, ServerConfig
from engine.serving.step_stats import StepStats
from engine.step_failures import RequestsFailed
from engine.worker.lora.errors import LoraNotFound
from shared.model_info import ModelInfo
from shared.protocol import (
    DEADLINE_EXCEEDED,
    MODEL_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_FAILED,
    REQUEST_REJECTED,
    SHUTTING_DOWN,
    Abort,
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
    StepOutputs,
    UnloadAdapter,
    decode,
    encode,
)

log = logging.getLogger("pageserve.engine")

__all__ = ["MAX_MESSAGE_BYTES", "CoreLike", "EngineServer", "ServerConfig"]


DEADLINE_CHECK_S = 0.1
"""How often the in-flight table is scanned for requests past their deadline."""
READ_WAIT_MS = 20
"""The longest poll while the core's only work waits on adapter reads (a finished read wakes it sooner)."""


class EngineServer:
    def __init__(self, core: CoreLike, info: ModelInfo, config: ServerConfig) -> None:
        """`info`: the core's model facts (EngineCore.model_info), sent to every gateway in Ready."""
        self.core, self.info, self.config = core, info, config
        self._ctx = zmq.Context()
        self._sock, self._auth = open_router(self._ctx, config)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # Signals and other threads wake the poll through this pair (see request_stop).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_r.fileno(), zmq.POLLIN)
        self._gateways: dict[bytes, str] = {}
        self._inflight = InFlightTable()
        self._stop_deadline: float | None = None
        self._next_deadline_check = 0.0
        self.stats = StepStats()
        self._lora = LoraCalls(core, self._wake)
        self._waits_on_reads: Callable[[], bool] = getattr(core, "waits_only_on_reads", lambda: False)
        """EngineCore's: its last step was empty and evicted adapters are being read (engine/worker/lora/)."""
        self.on_model_update: Callable[[ModelInfo], None] | None = None
        """Told the new model facts when adapters load or unload (the Redis announcement, main.py)."""

    # ----------------------------------------------------------------- lifecycle

    @property
    def wakeup_fd(self) -> int:
        """For `signal.set_wakeup_fd` (engine/serving/main.py): a signal wakes the loop's poll whichever
        thread the kernel delivers it to. Python runs handlers only in the main thread, so a SIGTERM
        landing on a gloo or OpenMP thread set a flag while the main thread slept in poll(None)."""
        return self._wake_w.fileno()

    def request_stop(self) -> None:
        """Begin a graceful shutdown; safe from a signal handler or another thread."""
        now = time.monotonic()
        # A second request (Ctrl-C twice) skips what is left of the grace period.
        self._stop_deadline = now + self.config.shutdown_grace_s if self._stop_deadline is None else now
        self._wake()

    def _wake(self) -> None:
        # BlockingIOError: the pipe is full, a wake-up is pending anyway; BrokenPipeError/OSError: the loop
        # has already ended (a fatal error) and closed its end, so there is nothing left to wake.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def serve(self) -> int:
        """Run until stopped; returns the process exit code (0 after SIGTERM, 1 after a fatal error)."""
        log.info("engine listening on %s (model %s, %d KV blocks of %d tokens)", self.address,
                 self.info.model_name, self.info.num_blocks, self.info.block_size)
        try:
            while not self._done_stopping():
                self._wait_for_io()
                started = time.perf_counter()
                self._drain()
                self._finish_lora_loads()
                self._expire_deadlines()
                if self.core.has_unfinished_requests():
                    self._step(started)
        except Exception as e:
            log.exception("fatal engine error")
            self._broadcast_engine_error(f"engine failed: {type(e).__name__}: {e}")
            self._close()
            return 1
        self._finish_shutdown()
        self._close()
        return 0

    def _done_stopping(self) -> bool:
        if self._stop_deadline is None:
            return False
        return not self._inflight or time.monotonic() >= self._stop_deadline

    def _wait_for_io(self) -> None:
        if self.core.has_unfinished_requests():  # work to do: only look, never wait; unless it all waits on
            timeout: int | None = READ_WAIT_MS if self._waits_on_reads() else 0  # reads (no empty-step spin)
        elif self._stop_deadline is not None:
            timeout = math.ceil(max(0.0, self._stop_deadline - time.monotonic()) * 1000)
        else:
            timeout = None  # idle: sleep until a message or a signal arrives
        events = dict(self._poller.poll(timeout))
        if self._wake_r.fileno() in events:
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass

    def _finish_shutdown(self) -> None:
        aborted = self._inflight.ids()
        if aborted:
            self.core.abort_requests(aborted)
            self._inflight.drop(aborted)
            self.stats.num_aborted += len(aborted)
            log.info("shutdown: aborted %d in-flight requests after the grace period", len(aborted))
        self._broadcast_engine_error(
            f"engine shutting down (stop requested); {len(aborted)} in-flight request(s) aborted"
        )

    def _close(self) -> None:
        self._lora.close()
        self._sock.close(linger=self.config.close_linger_ms)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()  # returns once the final messages are flushed (or the linger ran out)
        if self.address.startswith("ipc://"):  # libzmq leaves the socket file behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address.removeprefix("ipc://"))
        log.info("engine stopped")
        self._wake_r.close()
        self._wake_w.close()

    # ----------------------------------------------------------------- incoming

    def _drain(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                log.warning("dropping a message with %d frames (expected identity + payload)", len(frames))
                if len(frames) > 2:
                    self._send(frames[0], Error(None, "request", "expected exactly one frame per message"))
                continue
            self._handle(frames[0], frames[1])

    def _handle(self, gateway: bytes, frame: bytes) -> None:
        try:
            msg = decode(frame)
        except ProtocolError as e:
            log.warning("malformed message from gateway %s: %s", self._name(gateway), e)
            self._send(gateway, Error(e.request_id, "request", f"malformed message: {e}"))
            return
        if isinstance(msg, Hello):
            self._on_hello(gateway, msg)
        elif gateway not in self._gateways:
            self._send(gateway, Error(None, "request", "send Hello before any other message"))
        elif isinstance(msg, AddRequest):
            self._on_add(gateway, msg)
        elif isinstance(msg, Abort):
            self._on_abort(gateway, msg.request_ids)
        elif isinstance(msg, GetStats):
            counts = self.core.counts()
            self._send(gateway, self.stats.snapshot(counts, len(self._gateways), self._inflight.num_finished,
                                                    self._inflight.loads()))
        elif isinstance(msg, Bye):
            self._forget_gateway(gateway, f"said goodbye ({msg.reason or 'no reason'})")
        elif isinstance(msg, LoadAdapter):
            if (refused := self._lora.load(gateway, msg)) is not None:
                self._send(gateway, refused)
        elif isinstance(msg, UnloadAdapter):
            reply, changed = self._lora.unload(msg)
            self._answer_lora(gateway, reply, changed)
        else:
            log.warning("unexpected %s from gateway %s", type(msg).__name__, self._name(gateway))
            self._send(gateway, Error(None, "request", f"a gateway may not send {type(msg).__name__}"))

    def _on_hello(self, gateway: bytes, hello: Hello) -> None:
        if hello.protocol_version != PROTOCOL_VERSION:
            log.warning("refused gateway %s: protocol version %d", hello.gateway_id, hello.protocol_version)
            self._send(gateway, Error(None, "engine", (
                f"protocol version mismatch: the engine speaks version {PROTOCOL_VERSION}, "
                f"gateway {hello.gateway_id!r} speaks version {hello.protocol_version}")))
            return
        self._gateways[gateway] = hello.gateway_id
        log.info("gateway %s connected", hello.gateway_id)
        self._send(gateway, Ready(PROTOCOL_VERSION, self.info))

    def _on_add(self, gateway: bytes, add: AddRequest) -> None:
        if self._stop_deadline is not None:
            self._send(gateway, Error(add.request_id, "request", "the engine is shutting down and admits no new "
                                      "requests", code=SHUTTING_DOWN))
            return
        if add.request_id in self._inflight:
            self._send(gateway, Error(add.request_id, "request", f"request id {add.request_id!r} is already in "
                                      "flight", code=REQUEST_REJECTED, param="request_id"))
            return
        # Every other check (token ids, numbers, emptiness, length, KV room) is the core's admission
        # (engine/scheduling/request_checks.py); the EOS id is the core's to stamp.
        request = Request(
            request_id=add.request_id, prompt_token_ids=list(add.prompt_token_ids), sampling=add.sampling,
            arrival_time=add.arrival_time or time.time(), priority=add.priority, tenant_id=add.tenant_id,
            weight=add.weight, cache_salt=add.cache_salt, grammar=add.grammar, lora_name=add.lora_name,
        )
        try:
            self.core.add_request(request)
        except AssertionError:
            raise  # a broken invariant: the core's state is unknown (fatal)
        except Exception as e:  # the core's verdict on a request it cannot serve; the engine goes on
            if not isinstance(e, ValueError):
                log.exception("admitting %s failed", add.request_id)
            not_found = isinstance(e, LoraNotFound)  # an adapter unloaded since the gateway heard: a 404
            self._send(gateway, Error(add.request_id, "request", str(e) or type(e).__name__,
                                      code=MODEL_NOT_FOUND if not_found else REQUEST_REJECTED,
                                      param="model" if not_found else getattr(e, "param", "")))
            return
        self._inflight.add(add, gateway)

    def _finish_lora_loads(self) -> None:
        for gateway, reply, changed in self._lora.completed():
            self._answer_lora(gateway, reply, changed)

    def _answer_lora(self, gateway: bytes, reply: Message, changed: bool) -> None:
        """New adapters are told to every gateway before the caller hears: its catalog is current when it answers."""
        if changed:
            self.info = self.core.model_info  # type: ignore[attr-defined]
            for other in list(self._gateways):
                self._send(other, ModelUpdate(self.info))
            if self.on_model_update is not None:
                self.on_model_update(self.info)
        self._send(gateway, reply)

    def _expire_deadlines(self) -> None:
        limit, now = self.config.request_deadline_s, time.monotonic()
        if limit is None or now < self._next_deadline_check:
            return
        self._next_deadline_check = now + DEADLINE_CHECK_S
        expired = self._inflight.added_before(now - limit)
        if not expired:
            return
        self.core.abort_requests(expired)
        self.stats.num_aborted += len(expired)
        for rid in expired:
            gateway = self._inflight.gateway_of(rid)
            self._inflight.drop([rid])
            if gateway is not None:
                self._send(gateway, Error(rid, "request", f"the request ran past the engine's deadline of {limit:g} s",
                                          code=DEADLINE_EXCEEDED))
        log.warning("aborted %d request(s) past the %g s deadline", len(expired), limit)

    def _on_abort(self, gateway: bytes, request_ids: list[str]) -> None:
        mine = self._inflight.owned(gateway, request_ids)
        if not mine:
            return  # finished already, or not this gateway's to abort
        self.core.abort_requests(mine)
        finished = [fin for rid in mine for fin in self._inflight.finish_all(rid, "abort")]
        self.stats.num_aborted += len(mine)
        self._send(gateway, StepOutputs([], finished, self.stats.num_steps))

    # ----------------------------------------------------------------- outgoing

    def _step(self, started: float) -> None:
        """One core step and its outputs; `started` is when this loop turn began draining messages."""
        step_start = time.perf_counter()
        try:
            deltas = self.core.step()
        except RequestsFailed as e:  # the core freed them; the engine goes on
            self._fail_requests(e.request_ids, e.message)
            return
        step_end = time.perf_counter()
        for gateway, (token_deltas, finished) in self._inflight.route(deltas).items():
            self._send(gateway, StepOutputs(token_deltas, finished, self.stats.num_steps + 1))
        self.stats.record_tokens(deltas)
        self.stats.record_step(len({d.request_id for d in deltas}), step_seconds=step_end - step_start,
                               loop_seconds=time.perf_counter() - started)

    def _fail_requests(self, request_ids: list[str], message: str) -> None:
        log.error("a step failed; failing its %d request(s): %s", len(request_ids), message)
        for rid in request_ids:
            gateway = self._inflight.gateway_of(rid)
            if gateway is not None:
                self._inflight.drop([rid])
                self._send(gateway, Error(rid, "request", message, code=REQUEST_FAILED))

    def _send(self, gateway: bytes, msg: Message) -> None:
        try:
            self._sock.send_multipart([gateway, encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._forget_gateway(gateway, "went away")
            elif e.errno == zmq.EAGAIN:  # its queue is full: dropping outputs would corrupt its streams
                self._forget_gateway(gateway, "cannot keep up (send queue full)")
            else:
                raise

    def _forget_gateway(self, gateway: bytes, why: str) -> None:
        """The gateway left: nobody will read its requests' outputs, so stop them."""
        name = self._gateways.pop(gateway, None)
        orphans = self._inflight.of_gateway(gateway)
        if orphans:
            self.core.abort_requests(orphans)
            self._inflight.drop(orphans)
            self.stats.num_aborted += len(orphans)
        log.info("gateway %s %s; aborted its %d requests", name, why, len(orphans))

    def _broadcast_engine_error(self, message: str) -> None:
        for gateway in list(self._gateways):
            self._send(gateway, Error(None, "engine", message))

    def _name(self, gateway: bytes) -> str:
        return self._gateways.get(gateway, gateway.hex())

