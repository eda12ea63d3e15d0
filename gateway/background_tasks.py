"""Stopping the gateway's background tasks (read loops, heartbeats, probes, retries) when their owner closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel each task and wait until all have ended. What a task ended with (cancelled, an exception
    it already logged where it ran, or done long ago) is not the closer's business: closing goes on."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
