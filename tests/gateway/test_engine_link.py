"""The gateway's engine link waits for a late engine and reconnects after a restart.

Uses the real `EngineServer` loop around the protocol tests' fake core (no model).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from engine.serving.server import EngineServer, ServerConfig
from gateway.engine_client import EngineUnavailableError
from gateway.engine_link import EngineLink
from tests.engine.serving.fake_core import INFO, FakeCore
from tests.support.redis_server import free_port


def serve(address: str) -> tuple[EngineServer, threading.Thread]:
    server = EngineServer(FakeCore(), INFO, ServerConfig(listen=address, shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return server, thread


async def until(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "condition not reached in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def test_waits_for_a_late_engine_then_reconnects_after_restart() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> None:
        link = EngineLink(address, retry_interval_s=0.1, handshake_timeout_s=0.5)
        starting = asyncio.create_task(link.start(timeout_s=20))
        await asyncio.sleep(0.6)  # the engine is still "loading its model"
        assert not starting.done() and link.client is None
        server, thread = serve(address)
        await asyncio.wait_for(starting, 10)
        assert link.client is not None and link.model_info is not None
        assert link.model_info.model_name == "fake"

        server.request_stop()
        await asyncio.to_thread(thread.join, 5)
        await until(lambda: link.client is None, 5)  # the shutdown notice marks the client dead

        server, thread = serve(address)  # systemd restarts the engine on the same address
        await until(lambda: link.client is not None, 10)
        assert (await link.client.stats()).num_gateways == 1  # type: ignore[union-attr]
        await link.close()
        server.request_stop()
        await asyncio.to_thread(thread.join, 5)

    asyncio.run(main())


def test_start_gives_up_after_its_timeout() -> None:
    link = EngineLink(f"tcp://127.0.0.1:{free_port()}", retry_interval_s=0.1, handshake_timeout_s=0.2)
    with pytest.raises(EngineUnavailableError, match="within"):
        asyncio.run(link.start(timeout_s=0.5))


def test_a_stuck_engine_loop_fails_open_streams_and_is_not_ready() -> None:
    """The socket stays up (ZMTP heartbeats answer) but steps stop: the step counter is the heartbeat."""
    from engine.serving.server import EngineServer, ServerConfig
    from gateway.engine_client import EngineDeadError
    from shared.protocol import AddRequest
    from shared.sampling import SamplingParams

    address = f"tcp://127.0.0.1:{free_port()}"
    core = FakeCore()
    server = EngineServer(core, INFO, ServerConfig(listen=address, shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()

    async def main() -> None:
        link = EngineLink(address, retry_interval_s=0.1, handshake_timeout_s=0.5, poll_interval_s=0.1, stall_s=0.8)
        await link.start(timeout_s=10)
        assert link.client is not None
        await until(lambda: link.latest_stats is not None, 5)
        await asyncio.sleep(1.2)  # idle longer than the stall limit: an idle engine that answers is live
        assert link.progressing
        core.step_gate.clear()  # the next step hangs (5 s) inside the loop
        stream = await link.client.submit(AddRequest("r1", [1, 2, 3], SamplingParams(max_tokens=50)))
        started = time.monotonic()

        async def drain() -> None:
            async for _ in stream:
                pass

        with pytest.raises(EngineDeadError, match="no progress"):
            await asyncio.wait_for(drain(), 4.0)  # without the guard: TimeoutError, not a pass
        assert time.monotonic() - started < 3.0
        assert not link.progressing and "no progress" in link.last_failure
        core.step_gate.set()  # the loop moves again: the link reconnects by itself
        await until(lambda: link.progressing, 10)
        await link.close()

    try:
        asyncio.run(main())
    finally:
        server.request_stop()
        thread.join(5)
