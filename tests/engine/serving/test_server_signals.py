"""SIGTERM stops the engine's loop whichever thread the kernel delivers it to (engine/serving/main.py).

A process with gloo or OpenMP threads may get a SIGTERM on one of them: Python's C handler then
only sets a flag, and the main thread, asleep in the loop's poll, never ran the handler (a
tensor-parallel engine ignored SIGTERM until it was killed). The wakeup fd makes the signal wake the poll.
"""

from __future__ import annotations

import signal
import threading
import time

from engine.serving.main import stop_signals
from engine.serving.server import EngineServer, ServerConfig
from tests.engine.serving.fake_core import INFO, FakeCore


def test_a_sigterm_on_another_thread_stops_the_idle_loop() -> None:
    server = EngineServer(FakeCore(), INFO, ServerConfig(listen="tcp://127.0.0.1:*", shutdown_grace_s=0.2,
                                                         close_linger_ms=0))
    idle = threading.Event()
    bystander = threading.Thread(target=idle.wait, daemon=True)  # plays a gloo/OpenMP thread
    bystander.start()
    watchdog_fired = threading.Event()

    def watchdog() -> None:  # ends a hung loop so the test fails instead of hanging
        if not stopped.wait(10.0):
            watchdog_fired.set()
            server.request_stop()

    stopped = threading.Event()
    threading.Timer(0.3, lambda: signal.pthread_kill(bystander.ident or 0, signal.SIGTERM)).start()
    threading.Thread(target=watchdog, daemon=True).start()
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        with stop_signals(server):
            assert server.serve() == 0
    finally:
        stopped.set()
        idle.set()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert not watchdog_fired.is_set(), "the SIGTERM on another thread did not wake the loop"
    assert time.monotonic() - t0 < 5.0
