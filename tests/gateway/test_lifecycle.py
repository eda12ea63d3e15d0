"""The SIGTERM drain: open requests get the drain time, then are failed; the worker stops after."""

from __future__ import annotations

import asyncio
import time

from gateway.lifecycle import Lifecycle


def run_drain(finish_after_s: float | None, drain_s: float = 0.3) -> tuple[list[str], float, bool]:
    failed: list[str] = []

    async def main() -> tuple[float, bool]:
        life = Lifecycle(drain_s, failed.append, settle_s=1.0)
        life.request_started()
        stopped = asyncio.Event()
        started = time.monotonic()
        life.begin_drain(stopped.set)
        life.begin_drain(stopped.set)  # a second SIGTERM changes nothing
        assert life.draining
        if finish_after_s is not None:
            await asyncio.sleep(finish_after_s)
            life.request_done()
        else:  # the request ends only once it is failed (as a failed stream closes)
            deadline = time.monotonic() + 3
            while not failed and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            life.request_done()
        await asyncio.wait_for(stopped.wait(), 5)
        return time.monotonic() - started, life.active == 0

    took, idle = asyncio.run(main())
    return failed, took, idle


def test_a_request_that_finishes_within_the_drain_time_is_not_failed() -> None:
    failed, took, idle = run_drain(finish_after_s=0.1)
    assert failed == [] and took < 0.3 and idle


def test_a_request_still_open_after_the_drain_time_is_failed_with_a_clear_reason() -> None:
    failed, took, idle = run_drain(finish_after_s=None)
    assert len(failed) == 1 and "shutting down" in failed[0] and "0.3 s" in failed[0]
    assert 0.3 <= took < 1.0 and idle


def test_retry_after_is_whole_seconds() -> None:
    assert Lifecycle(0.2, lambda _: None).retry_after_s() == 1
    assert Lifecycle(30, lambda _: None).retry_after_s() == 30
