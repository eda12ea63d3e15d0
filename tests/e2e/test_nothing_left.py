"""`pageserve up`, then SIGTERM: the temp directory is as it was, and /metrics had vLLM's series from the start.

redis-server, the gateway and the launcher are real processes in a private TMPDIR (other tests cannot
disturb it); the engine is the real `EngineServer` loop around the protocol tests' fake core, as in
test_launcher.py, so no model loads (the tensor-parallel engine's folder is checked by
tests/engine/worker/parallel/test_tensor_parallel_server.py). A stale metrics folder of a killed
gateway is swept at start; a live owner's is kept.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.serving.server import EngineServer, ServerConfig
from shared.model_info import ModelInfo
from shared.owned_dirs import LOCK_NAME, OwnedDir
from tests.engine.serving.fake_core import FakeCore
from tests.gateway.test_metrics_from_start import dashboard_vllm_series
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def first_scrape(port: int, up: subprocess.Popen[str], timeout_s: float = 120) -> tuple[float, set[str]]:
    """Poll the gateway's port every 2 ms; scrape /metrics the moment it listens: (delay, sample names)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline and up.poll() is None, "the gateway never listened"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                listening = time.monotonic()
                break
        time.sleep(0.002)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        delay = time.monotonic() - listening
        text = r.read().decode()
    return delay, {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def stop(up: subprocess.Popen[str]) -> None:
    """After a failed check too: SIGTERM lets `up` stop its children (they run in their own sessions, so a
    SIGKILL of `up` alone would leave the gateway and redis-server running)."""
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def test_up_and_sigterm_leave_the_temp_directory_as_it_was(tmp_path: Path) -> None:
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True).stdout)
    stale = private_tmp / f"pageserve-metrics-{dead_pid}-stale01"  # what a SIGKILLed gateway leaves
    stale.mkdir()
    (stale / LOCK_NAME).touch()
    (stale / "counter_1.db").touch()
    live = OwnedDir.create("pageserve-metrics-", str(private_tmp))  # a live gateway's (this process's)
    before = {live.path.name}

    info = ModelInfo("smollm2", max_model_len=128, block_size=16, eos_token_id=2, num_blocks=64, vocab_size=49152)
    engine = EngineServer(FakeCore(info=info), info, ServerConfig(listen=f"tcp://127.0.0.1:{free_port()}",
                                                                  shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    port = free_port()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    up = subprocess.Popen([sys.executable, "-m", "ops.cli", "up", "--engine", engine.address, "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        delay, names = first_scrape(port, up)
        print(f"first scrape {delay * 1000:.1f} ms after the port opened")
        assert delay < 0.1
        missing = dashboard_vllm_series() - names
        assert not missing, f"absent from the first scrape: {sorted(missing)}"
        assert "pageserve:engine_stats_reported" in names
        during = {p.name for p in private_tmp.iterdir()}
        assert stale.name not in during and live.path.name in during  # swept at start; the live one kept
        assert len({n for n in during if n.startswith("pageserve-metrics-")} - before) == 1, during  # the gateway's

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
    finally:
        stop(up)
        engine.request_stop()
        thread.join(5)
    assert {p.name for p in private_tmp.iterdir()} == before
    live.remove()
