"""The engine replicas `pageserve up` started: each with its log file, restarted when it dies, given up on
when it crash-loops.

    tick() (the launcher calls it every 0.2 s, from start-up on)
      running ──exited──> told: which engine, its exit status, how long it lived
                          RestartTracker (supervisor.py): start it again in d s ─> waiting
                                                          or a crash loop ─> CrashLoop (up stops, exit 1)
      waiting ──d s passed──> started again on the same address: the gateway rejoins it on its own
                              (gateway/replicas/ for several, gateway/engine_link.py for one)
      restarted ──its port answers──> told it is back

An engine binds its socket only once its model is loaded (engine/serving/main.py), so
an answering port means it serves again. Meanwhile the gateway routes to the live
replicas, or with one engine answers 503 with Retry-After. It knows nothing
about Redis or the gateway process.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ops.children import Child, spawn
from ops.supervisor import RestartTracker

LOG_TAIL_LINES = 5


class CrashLoop(RuntimeError):
    """An engine kept dying soon after its start: `up` stops with this message."""


@dataclass
class EngineReplica:
    name: str
    address: str
    argv: list[str]
    log: Path
    tracker: RestartTracker
    child: Child | None = None
    """None while it waits to be started again."""
    started_at: float = 0.0
    died_at: float | None = None
    """When it last died, until it is back."""
    restart_at: float | None = None


def exit_status(returncode: int) -> str:
    """'status 2' or 'signal SIGKILL' (Popen reports a signal as its negative number)."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(f"    {x}" for x in [x for x in text.splitlines() if x.strip()][-lines:])


def listening(address: str) -> bool:
    parts = urlsplit(address)
    if parts.scheme != "tcp" or parts.hostname is None or parts.port is None:
        return True  # ipc:// and the like: no port to ask; the gateway's own rejoin tells
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((parts.hostname, parts.port)) == 0


def _say(message: str) -> None:
    print(f"pageserve up: {message}", file=sys.stderr, flush=True)


class EngineGroup:
    def __init__(self, replicas: list[EngineReplica], say: Callable[[str], None] = _say,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas = replicas
        self._say = say
        self._clock = clock

    def start(self) -> None:
        for r in self.replicas:
            self._start(r)

    def children(self) -> list[Child]:
        return [r.child for r in self.replicas if r.child is not None]

    def tick(self) -> None:
        """Notice deaths, start the engines whose wait is over, tell who is back; raises CrashLoop."""
        now = self._clock()
        for r in self.replicas:
            if r.child is not None and r.child.proc.poll() is not None:
                self._on_exit(r, r.child.proc.returncode, now)
            elif r.child is None and r.restart_at is not None and now >= r.restart_at:
                self._start(r)
            elif r.child is not None and r.died_at is not None and listening(r.address):
                self._say(f"{r.name} is back on {r.address} (pid {r.child.proc.pid}), "
                          f"{now - r.died_at:.1f} s after it died")
                r.died_at = None

    def _start(self, r: EngineReplica) -> None:
        if r.died_at is not None:
            with open(r.log, "a") as f:  # where one life ends and the next begins, in the log itself
                f.write(f"---- pageserve up: restart {r.tracker.restarts} of {r.name} at "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')} ----\n")
        r.child = spawn(r.name, r.argv, log=r.log)
        r.started_at, r.restart_at = self._clock(), None

    def _on_exit(self, r: EngineReplica, returncode: int, now: float) -> None:
        lived = now - r.started_at
        delay = r.tracker.after_exit(lived)
        status = exit_status(returncode)
        r.child, r.died_at = None, now if r.died_at is None else r.died_at
        if delay is None:
            policy = r.tracker.policy
            raise CrashLoop(f"{r.name} ({r.address}) died {r.tracker.short_lives} times in a row within "
                            f"{policy.crash_loop_window_s:g} s of its start (last: {status}); not starting it again. "
                            f"Its log: {r.log}\n{log_tail(r.log)}")
        others = sum(1 for x in self.replicas if x.child is not None)
        meanwhile = (f"meanwhile the gateway routes to the replicas still running ({others})" if others else
                     "the gateway answers 503 with Retry-After meanwhile")
        self._say(f"{r.name} ({r.address}) exited with {status} after {lived:.1f} s; starting it again in "
                  f"{delay:.1f} s (restart {r.tracker.restarts}); {meanwhile}. Its log: {r.log}")
        r.restart_at = now + delay
