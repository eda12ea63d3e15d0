"""The one worker thread that reads adapter folders off the step loop.

    admin LoadAdapter (engine/serving/lora_calls.py) ──┐
    a request for an evicted adapter (evicted_reads.py) ┴─> submit(read) ─> [lora-load thread] ─> future
                                                                              done: wake() the loop
Reading safetensors and laying tensors out takes tens of milliseconds per 50 MB: on the loop it
would stall every running stream for that long. Reads run one at a time, in the order asked, on
one thread whoever asked: two readers would only compete for the same disk and cores. The
thread touches no registry or scheduler state; the loop installs what it read. Knows nothing
about requests or sockets.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LoraReader:
    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.wake: Callable[[], None] = lambda: None
        """Called (on the reader thread) when a read finishes: the engine server makes its poll return."""

    def submit(self, read: Callable[[], T]) -> concurrent.futures.Future[tuple[T, float]]:
        """Run `read` on the reader thread; the future holds (its result, seconds it took) or its exception."""
        if self._pool is None:  # the thread starts with the first read: an engine that never reads has none
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lora-load")
        future = self._pool.submit(_timed, read)
        future.add_done_callback(lambda _: self.wake())
        return future

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _timed(read: Callable[[], T]) -> tuple[T, float]:
    began = time.perf_counter()
    result = read()
    return result, time.perf_counter() - began
