"""`pageserve up` as a child of a test: its output read by a thread (so a full pipe never blocks the
launcher or the gateway that shares it), lines waited for, stopped for good at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable


class UpProcess:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "ops.cli", "up", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float) -> str:
        """The first line (from the start) that satisfies `predicate`; fails on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((x for x in list(self.lines) if predicate(x)), None)
            if found is not None:
                return found
            assert self.proc.poll() is None, f"up exited with {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"no such line within {timeout_s:g} s:\n{self.output}"
            time.sleep(0.1)

    def wait_for_re(self, pattern: str, timeout_s: float) -> re.Match[str]:
        line = self.wait_for(lambda x: re.search(pattern, x) is not None, timeout_s)
        match = re.search(pattern, line)
        assert match is not None
        return match

    def stop(self) -> None:
        """Whatever state it is in: SIGTERM first, as its children run in sessions of their own and only
        `up` stops them (a failed test must not leave engines behind); SIGKILL if that hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
