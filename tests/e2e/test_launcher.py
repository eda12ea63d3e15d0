"""`pageserve up` as a user runs it: prints a key and a curl line that works; Ctrl-C stops everything; an engine
that cannot start ends it with its log named.

The engine here is the real `EngineServer` loop around the protocol tests' fake
core (`--engine ADDRESS` makes `up` use a running engine), so this costs no
model load; redis-server, the gateway and the launcher are real processes.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.serving.server import EngineServer, ServerConfig
from shared.model_info import ModelInfo
from tests.engine.serving.fake_core import FakeCore
from tests.support.redis_server import free_port
from tests.support.up_process import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_up_prints_a_working_curl_line_and_ctrl_c_stops_all() -> None:
    info = ModelInfo("smollm2", max_model_len=128, block_size=16, eos_token_id=2, num_blocks=64, vocab_size=49152)
    engine = EngineServer(FakeCore(info=info), info, ServerConfig(listen=f"tcp://127.0.0.1:{free_port()}",
                                                        shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "ops.cli", "up", "--engine", engine.address, "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert up.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while not any(line.startswith("curl ") for line in lines):
            assert time.monotonic() < deadline and up.poll() is None, "".join(lines)
            lines.append(up.stdout.readline())
        out = "".join(lines)
        key = re.search(r"^\s+(ps-\S+)$", out, re.M)
        redis_port = int(re.search(r"redis redis://127\.0\.0\.1:(\d+)/0", out).group(1))  # type: ignore[union-attr]
        assert key is not None and key.group(1) in lines[-1]
        curl = subprocess.run(shlex.split(lines[-1]), capture_output=True, text=True, timeout=60)
        assert curl.returncode == 0
        assert '"object":"chat.completion.chunk"' in curl.stdout and curl.stdout.endswith("data: [DONE]\n\n")
        assert port_open(port) and port_open(redis_port)

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
        assert not port_open(port) and not port_open(redis_port)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        engine.request_stop()
        thread.join(5)


def test_an_engine_that_cannot_start_ends_up_with_status_1_and_its_log_named(tmp_path: Path) -> None:
    """A bad flag through --engine-args: the engine dies at once, is started again once after the units' first
    back-off, dies again, and `up` gives up (--crash-loop-count 2): exit status 1, the log named, all stopped."""
    port = free_port()
    up = UpProcess(["--port", str(port), "--engine-args=--no-such-flag", "--crash-loop-count", "2",
                    "--crash-loop-window", "30", "--log-dir", str(tmp_path)])
    try:
        assert up.proc.wait(timeout=90) == 1
        up.stop()  # the reader has every line
        out = up.output
        log = tmp_path / "engine.log"
        assert re.search(r"engine \(tcp://127\.0\.0\.1:\d+\) exited with status 2 after [\d.]+ s; starting it again "
                         r"in 2\.0 s \(restart 1\)", out), out
        assert re.search(r"engine \(tcp://127\.0\.0\.1:\d+\) died 2 times in a row within 30 s of its start "
                         rf"\(last: status 2\); not starting it again\. Its log: {re.escape(str(log))}", out), out
        assert "restart 2" not in out and "unrecognized arguments: --no-such-flag" in out  # the tail says why
        assert log.read_text().count("unrecognized arguments: --no-such-flag") == 2  # both lives, one log
        assert not port_open(port)
    finally:
        up.stop()
