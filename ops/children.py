"""The child processes `pageserve up` starts: each in its own session, stopped in order with a grace.

Children run in their own sessions, so a terminal's Ctrl-C reaches only the
launcher and the shutdown order stays its own. A child's output goes to the
terminal, nowhere (quiet), or appended to a log file (engine replicas: a
restarted one writes after its predecessor). It knows nothing about what the
children are.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 15.0


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    cleanup: list[str] = field(default_factory=list)
    """Temporary folders to delete once the process is gone."""


def spawn(name: str, argv: list[str], quiet: bool = False, env: dict[str, str] | None = None,
          log: Path | None = None) -> Child:
    # start_new_session: the terminal's Ctrl-C reaches only the launcher, which stops children in order.
    full_env = None if env is None else {**os.environ, **env}
    if log is None:
        out = subprocess.DEVNULL if quiet else None
        return Child(name, subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=out, env=full_env))
    with open(log, "ab") as f:  # the child keeps its own copy of the descriptor
        return Child(name, subprocess.Popen(argv, start_new_session=True, stdout=f, stderr=subprocess.STDOUT,
                                            env=full_env))


def stop_all(children: list[Child], grace_s: float = STOP_GRACE_S) -> None:
    """Stop in reverse start order: gateway, engine, redis. SIGTERM, then SIGKILL after the grace."""
    for c in reversed(children):
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
            try:
                c.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                print(f"pageserve up: {c.name} did not stop in {grace_s:g} s; killing it", file=sys.stderr)
                c.proc.kill()
                c.proc.wait()
        for path in c.cleanup:
            shutil.rmtree(path, ignore_errors=True)
