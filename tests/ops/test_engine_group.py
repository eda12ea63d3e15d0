"""`pageserve up`'s engine replicas: a dead one is told and started again after the back-off, a crash loop
stops with its log named. Tiny shell commands stand in for engines; the clock is the test's."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from ops.engine_group import CrashLoop, EngineGroup, EngineReplica, exit_status
from ops.supervisor import UNIT_BACKOFF, RestartPolicy, RestartTracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def group(tmp_path: Path, script: str, address: str = "tcp://127.0.0.1:1", count: int = 3,
          ) -> tuple[EngineGroup, Clock, list[str]]:
    said: list[str] = []
    clock = Clock()
    replica = EngineReplica("engine-1", address, ["/bin/sh", "-c", script], tmp_path / "engine-1.log",
                            RestartTracker(RestartPolicy(crash_loop_count=count, crash_loop_window_s=60)))
    g = EngineGroup([replica], say=said.append, clock=clock)
    g.start()
    return g, clock, said


def wait_exit(g: EngineGroup) -> None:
    child = g.replicas[0].child
    assert child is not None
    child.proc.wait(timeout=10)


def test_a_dead_engine_is_told_and_started_again_after_the_back_off(tmp_path: Path) -> None:
    g, clock, said = group(tmp_path, "echo loading; exit 3")
    first = g.replicas[0].child
    wait_exit(g)
    clock.now += 5
    g.tick()
    assert g.replicas[0].child is None and g.children() == []
    assert said == [f"engine-1 (tcp://127.0.0.1:1) exited with status 3 after 5.0 s; starting it again in "
                    f"{UNIT_BACKOFF.delay(1):.1f} s (restart 1); the gateway answers 503 with Retry-After meanwhile. "
                    f"Its log: {tmp_path / 'engine-1.log'}"]
    clock.now += UNIT_BACKOFF.delay(1) - 0.1
    g.tick()
    assert g.replicas[0].child is None  # not before its time
    clock.now += 0.1
    g.tick()
    second = g.replicas[0].child
    assert second is not None and first is not None and second.proc.pid != first.proc.pid
    wait_exit(g)
    log = (tmp_path / "engine-1.log").read_text()
    assert log.startswith("loading\n---- pageserve up: restart 1 of engine-1 at ") and log.endswith("----\nloading\n")


def test_a_crash_loop_stops_with_the_log_named_and_its_last_lines(tmp_path: Path) -> None:
    g, clock, said = group(tmp_path, "echo 'error: unrecognized arguments: --bogus' >&2; exit 2", count=2)
    wait_exit(g)
    g.tick()
    clock.now += UNIT_BACKOFF.delay(1)
    g.tick()
    wait_exit(g)
    with pytest.raises(CrashLoop) as e:
        g.tick()
    message = str(e.value)
    assert message.startswith("engine-1 (tcp://127.0.0.1:1) died 2 times in a row within 60 s of its start "
                              "(last: status 2); not starting it again.")
    assert f"Its log: {tmp_path / 'engine-1.log'}" in message
    assert message.endswith("    error: unrecognized arguments: --bogus")
    assert len(said) == 1  # one restart was announced, the second death was the last


def test_a_restarted_engine_is_told_back_once_its_port_answers(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        g, clock, said = group(tmp_path, "exit 1", address=address)
        wait_exit(g)
        g.tick()
        g.replicas[0].argv = ["/bin/sh", "-c", "sleep 30"]
        clock.now += UNIT_BACKOFF.delay(1)
        g.tick()  # started again
        g.tick()
        assert len(said) == 1  # its port does not answer yet: not back
        listener.listen()
        clock.now += 3
        g.tick()
        child = g.replicas[0].child
        assert child is not None
        assert said[1] == f"engine-1 is back on {address} (pid {child.proc.pid}), {UNIT_BACKOFF.delay(1) + 3:.1f} " \
                          "s after it died"
        g.tick()
        assert len(said) == 2  # told once
        child.proc.kill()
        child.proc.wait()


def test_exit_statuses_read_as_a_user_would() -> None:
    assert exit_status(0) == "status 0" and exit_status(2) == "status 2"
    assert exit_status(-9) == "signal SIGKILL" and exit_status(-15) == "signal SIGTERM"


def test_other_live_replicas_are_named_as_the_fallback(tmp_path: Path) -> None:
    said: list[str] = []
    policy = RestartPolicy()
    replicas = [EngineReplica(f"engine-{i}", f"tcp://127.0.0.1:{i + 1}", ["/bin/sh", "-c", script],
                              tmp_path / f"engine-{i}.log", RestartTracker(policy))
                for i, script in enumerate(["exit 0", f"exec {sys.executable} -c 'import time; time.sleep(30)'"])]
    g = EngineGroup(replicas, say=said.append, clock=Clock())
    g.start()
    try:
        assert replicas[0].child is not None
        replicas[0].child.proc.wait(timeout=10)
        g.tick()
        assert "exited with status 0" in said[0] and "meanwhile the gateway routes to the replicas still running (1)" in said[0]
    finally:
        for c in g.children():
            c.proc.kill()
            c.proc.wait()
