"""The gateway worker's lifecycle: serving, draining after SIGTERM, then stopping.

On SIGTERM (systemd stop, deploy) a worker does not stop at once:

    1. `/ready` answers 503 at once (load balancers take it out of rotation), and
       every new request gets 503 with `Retry-After` and `Connection: close`;
    2. open requests may finish for `drain_s` seconds;
    3. what is still open then ends with a clear SSE error event (or a 503) through
       `fail_open` (the engine link fails their streams), and each is settled as usual;
    4. once no request is left (or `settle_s` more passed) uvicorn's own exit runs.

uvicorn installs its SIGTERM handler before the lifespan starts; `install` takes
it over for the worker and calls uvicorn's handler only at step 4. A second
SIGINT still forces uvicorn out at once. It knows nothing about routes or Redis.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("pageserve.gateway")

SETTLE_S = 5.0
"""After the drain time, how long failed requests get to close and settle before the worker exits anyway."""


class Lifecycle:
    def __init__(self, drain_s: float, fail_open: Callable[[str], None], settle_s: float = SETTLE_S) -> None:
        self.drain_s = drain_s
        self.settle_s = settle_s
        self._fail_open = fail_open
        self.draining = False
        self.drain_started: float | None = None
        self.active = 0
        """HTTP requests in this worker that are not done yet (counted by the request middleware)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ request accounting

    def request_started(self) -> None:
        self.active += 1
        self._idle.clear()

    def request_done(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    def retry_after_s(self) -> int:
        return max(1, round(self.drain_s))

    # ------------------------------------------------------------ draining

    def begin_drain(self, then: Callable[[], None]) -> None:
        """Start draining (idempotent); `then` runs when the worker may exit."""
        if self.draining:
            return
        self.draining = True
        self.drain_started = time.monotonic()
        log.info("draining: /ready is 503, new requests are refused; %d open request(s) get %.1f s to finish",
                 self.active, self.drain_s)
        self._task = asyncio.get_running_loop().create_task(self._drain(then))

    async def _drain(self, then: Callable[[], None]) -> None:
        if not await self._wait_idle(self.drain_s):
            log.warning("drain time over: ending %d open request(s) with an error", self.active)
            self._fail_open(f"the gateway is shutting down (the drain time of {self.drain_s:g} s is over); "
                            "retry the request")
            await self._wait_idle(self.settle_s)
        log.info("drained; stopping the worker")
        then()

    async def _wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def install(self) -> None:
        """Take SIGTERM over in this worker (main thread only: not under a test client's thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        uvicorn_exit = signal.getsignal(signal.SIGTERM)

        def stop() -> None:
            if callable(uvicorn_exit):
                uvicorn_exit(signal.SIGTERM, None)
            else:  # no server handler to defer to: nothing else would stop the process
                signal.raise_signal(signal.SIGINT)

        def on_sigterm(sig: int, frame: FrameType | None) -> Any:
            loop.call_soon_threadsafe(self.begin_drain, stop)

        signal.signal(signal.SIGTERM, on_sigterm)
