"""The gateway's lasting link to the engine: connect, watch the engine's progress, reconnect.

`EngineClient` (protocol engineer) is one connection: once the engine dies it
stays dead, failing every open stream with `EngineDeadError` (-> 503). This
link owns replacing it: start-up waits for the engine's handshake (it may still
be loading the model), then a background task notices a dead client and keeps
trying a fresh one, so an engine restarted by systemd is picked up without
restarting the gateway.

A live socket is not a live engine: a loop stuck inside a step still answers
ZeroMQ heartbeats. So a second task asks for `Stats` every `poll_interval_s`;
the engine's step counter (`num_steps`) is its heartbeat. The engine made
progress when the counter moved, or when it answered and had no work. With
work in flight and no progress for `stall_s`, the link fails the client: open
streams end with a clear error, `/ready` turns 503, and the reconnect loop takes
over. The latest Stats also feed /metrics (gateway/metrics.py). It knows nothing
about HTTP or tokenizers.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.background_tasks import cancel_and_wait
from gateway.engine_client import EngineClient, EngineError, EngineUnavailableError
from shared.curve import ClientKeys
from shared.model_info import ModelInfo
from shared.protocol import Stats

log = logging.getLogger("pageserve.gateway")


class EngineLink:
    def __init__(self, address: str, retry_interval_s: float = 1.0, handshake_timeout_s: float = 5.0,
                 poll_interval_s: float = 1.0, stall_s: float = 30.0, curve: ClientKeys | None = None) -> None:
        self.address = address
        self._curve = curve
        self._retry_interval_s = retry_interval_s
        self._handshake_timeout_s = handshake_timeout_s
        self._poll_interval_s = poll_interval_s
        self.stall_s = stall_s
        self._client: EngineClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.latest_stats: Stats | None = None
        self._last_progress = time.monotonic()
        self._last_steps: int | None = None
        self.last_failure = ""
        """Why the engine was last given up on (for /ready)."""

    @property
    def client(self) -> EngineClient | None:
        """The connected client, or None while the engine is unreachable."""
        return self._client if self._client is not None and self._client.healthy else None

    @property
    def model_info(self) -> ModelInfo | None:
        client = self.client
        return client.model_info if client is not None else None

    def seconds_since_progress(self) -> float:
        return time.monotonic() - self._last_progress

    @property
    def progressing(self) -> bool:
        """Connected, and the engine's loop moved (or answered while idle) within the stall time."""
        return self.client is not None and self.seconds_since_progress() <= self.stall_s

    async def start(self, timeout_s: float) -> None:
        """Connect once (retrying until `timeout_s`), then keep the link alive in the background."""
        deadline = time.monotonic() + timeout_s
        while not await self._connect():
            if time.monotonic() >= deadline:
                raise EngineUnavailableError(f"no engine answered at {self.address} within {timeout_s:g} s")
            await asyncio.sleep(self._retry_interval_s)
        self._tasks = [asyncio.create_task(self._keep_alive()), asyncio.create_task(self._watch_progress())]

    async def _connect(self) -> bool:
        client = EngineClient(self.address, handshake_timeout=self._handshake_timeout_s, curve=self._curve)
        try:
            await client.start()
        except EngineUnavailableError as e:
            # Expected while the engine loads its model at start-up; a lost engine was logged already.
            log.info("engine not available yet: %s", e)
            return False
        self._client = client
        self._last_progress = time.monotonic()
        self._last_steps = None
        return True

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._retry_interval_s)
            if self._client is not None and self._client.healthy:
                continue
            if self._client is not None:
                await self._client.close()
                self._client = None
                log.error("lost the engine at %s; reconnecting", self.address)
            if await self._connect():
                log.info("reconnected to the engine at %s", self.address)

    async def _watch_progress(self) -> None:
        """Ask for Stats (one question at a time: a long step delays the answer, it does not lose it)
        and fail the client when it has work and its step counter stood still for `stall_s`."""
        pending: asyncio.Task[Stats | None] | None = None
        while True:
            await asyncio.sleep(self._poll_interval_s)
            client = self.client
            if client is None:
                pending = None
                continue
            if pending is not None and pending.done():
                stats = pending.result()
                if stats is not None:
                    self._on_stats(stats)
                pending = None
            if pending is None:
                pending = asyncio.create_task(_stats_or_none(client, self.stall_s))
            if client.last_step > self._steps_seen():  # StepOutputs arrive after every step with output
                self._progress(client.last_step)
            work = client.num_open_streams > 0 or (self.latest_stats is not None and _has_work(self.latest_stats))
            if work and self.seconds_since_progress() > self.stall_s and client is self.client:
                self.last_failure = (f"the engine made no progress for {self.seconds_since_progress():.0f} s "
                                     f"with work in flight (stall limit {self.stall_s:g} s)")
                log.error("%s; failing its open requests and reconnecting", self.last_failure)
                client.fail(self.last_failure)
                pending = None

    def _on_stats(self, stats: Stats) -> None:
        if stats.num_steps > self._steps_seen() or not _has_work(stats):
            self._progress(stats.num_steps)
        self.latest_stats = stats

    def _steps_seen(self) -> int:
        return -1 if self._last_steps is None else self._last_steps

    def _progress(self, step: int) -> None:
        self._last_progress = time.monotonic()
        self._last_steps = max(step, self._steps_seen())

    def fail_open(self, reason: str) -> None:
        """End every open request of this gateway with `reason` (the drain time is over)."""
        if self._client is not None:
            self._client.fail(reason)

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self._client is not None:
            await self._client.close()
            self._client = None


async def _stats_or_none(client: EngineClient, timeout_s: float) -> Stats | None:
    try:
        return await client.stats(timeout=timeout_s)
    except (TimeoutError, EngineError):
        return None


def _has_work(stats: Stats) -> bool:
    return stats.num_running + stats.num_waiting + stats.num_swapped > 0
