"""When a dead engine replica is started again, and when that stops: pure Python, no processes, no clock.

The delays are the systemd units' (ops/units.py writes these same numbers into them):
RestartSec=2, then systemd's RestartSteps interpolation up to RestartMaxDelaySec,

    restart:  1     2      3      4       5       6       7, 8, ...
    delay:    2 s   4.0 s  7.8 s  15.5 s  30.7 s  60.7 s  120 s

(systemd >= 254: r_i = r_0 * (r_max / r_0) ** ((i - 1) / steps), RestartSec alone
for the first restart). `pageserve up` (ops/engine_group.py) asks a
`RestartTracker` after every exit of its engine: wait this long and start it
again, or give up. It gives up on a crash loop: an engine that died within
`crash_loop_window_s` of its start, `crash_loop_count` times in a row, never
came to serve, and restarting it forever would only hide why. A death after a
longer life is a new incident: the count and the back-off start over.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_s: float = 2.0
    """RestartSec: the wait before the first restart of an incident."""
    max_s: float = 120.0
    """RestartMaxDelaySec: the longest wait."""
    steps: int = 6
    """RestartSteps: restarts taken to grow from `first_s` to `max_s` (0: always `first_s`)."""

    def delay(self, restart: int) -> float:
        """Seconds before restart number `restart` (1 for the first) of one incident."""
        assert restart >= 1, restart
        if restart == 1 or self.steps == 0 or self.first_s >= self.max_s:
            return self.first_s
        if restart > self.steps:
            return self.max_s
        return self.first_s * (self.max_s / self.first_s) ** ((restart - 1) / self.steps)


UNIT_BACKOFF = Backoff()
"""The one statement of the restart delays: the systemd units and `pageserve up` both use it."""


@dataclass(frozen=True)
class RestartPolicy:
    backoff: Backoff = UNIT_BACKOFF
    crash_loop_count: int = 5
    """Give up after this many short lives in a row (`up --crash-loop-count`)."""
    crash_loop_window_s: float = 60.0
    """A life shorter than this is short: the engine died while loading or soon after (`--crash-loop-window`)."""

    def __post_init__(self) -> None:
        if self.crash_loop_count < 1:
            raise ValueError(f"crash_loop_count must be at least 1, not {self.crash_loop_count}")
        if self.crash_loop_window_s < 0:
            raise ValueError(f"crash_loop_window_s must not be negative, not {self.crash_loop_window_s:g}")


@dataclass
class RestartTracker:
    """One engine's restart history (mutable: the launcher keeps one per replica)."""

    policy: RestartPolicy
    short_lives: int = 0
    """Deaths in a row that came within the window of their start."""
    restarts: int = 0
    """Restarts in the current incident (the back-off's step)."""

    def after_exit(self, lived_s: float) -> float | None:
        """Seconds to wait before starting the engine again after a life of `lived_s`, or None: a crash
        loop, do not start it again."""
        if lived_s >= self.policy.crash_loop_window_s:  # it had been up a while: a new incident
            self.short_lives = self.restarts = 0
        else:
            self.short_lives += 1
            if self.short_lives >= self.policy.crash_loop_count:
                return None
        self.restarts += 1
        return self.policy.backoff.delay(self.restarts)
