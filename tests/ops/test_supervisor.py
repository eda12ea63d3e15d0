"""The restart policy of `pageserve up`: the systemd units' back-off, and when a crash loop ends it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.supervisor import UNIT_BACKOFF, Backoff, RestartPolicy, RestartTracker
from ops.units import UnitOptions, units

TEMPLATE = Path(__file__).parents[2] / "ops" / "systemd" / "pageserve-engine@.service"


def test_delays_follow_systemds_restart_steps() -> None:
    # systemd >= 254: RestartSec, then r0 * (rmax / r0) ** ((i - 1) / steps), then RestartMaxDelaySec.
    delays = [UNIT_BACKOFF.delay(i) for i in range(1, 10)]
    assert delays == pytest.approx([2, 3.958, 7.832, 15.49, 30.66, 60.66, 120, 120, 120], rel=1e-3)
    assert Backoff(first_s=1, max_s=8, steps=0).delay(5) == 1  # no steps: RestartSec every time


def test_the_units_state_the_same_delays() -> None:
    service = units(UnitOptions(systemd_version=254))["pageserve-engine.service"]
    b = UNIT_BACKOFF
    assert f"RestartSec={b.first_s:g}\nRestartSteps={b.steps}\nRestartMaxDelaySec={b.max_s:g}" in service
    assert f"RestartSec={b.first_s:g}\n" in TEMPLATE.read_text()  # the static replica template agrees


def test_short_lives_in_a_row_end_in_a_crash_loop() -> None:
    tracker = RestartTracker(RestartPolicy(crash_loop_count=3, crash_loop_window_s=60))
    assert tracker.after_exit(lived_s=5) == UNIT_BACKOFF.delay(1)
    assert tracker.after_exit(lived_s=59) == UNIT_BACKOFF.delay(2)
    assert tracker.after_exit(lived_s=1) is None  # the third short life: give up
    assert tracker.short_lives == 3


def test_a_long_life_starts_a_new_incident() -> None:
    tracker = RestartTracker(RestartPolicy(crash_loop_count=2, crash_loop_window_s=60))
    assert tracker.after_exit(lived_s=1) == UNIT_BACKOFF.delay(1)
    assert tracker.after_exit(lived_s=3600) == UNIT_BACKOFF.delay(1)  # it served an hour: count and back-off reset
    assert tracker.short_lives == 0 and tracker.restarts == 1
    assert tracker.after_exit(lived_s=1) == UNIT_BACKOFF.delay(2)
    assert tracker.after_exit(lived_s=1) is None


def test_nonsense_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="crash_loop_count"):
        RestartPolicy(crash_loop_count=0)
    with pytest.raises(ValueError, match="crash_loop_window_s"):
        RestartPolicy(crash_loop_window_s=-1)
