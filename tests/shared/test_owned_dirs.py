"""The stale-folder rule: only a dead owner's folder is swept; a live process's never is.

Owners here are real processes (a killed one, a sleeping one); the parent is a private folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from shared.owned_dirs import LOCK_NAME, OwnedDir, owner_pid, sweep_stale

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "pageserve-test-"


def owner(parent: Path, then: str) -> subprocess.Popen[str]:
    """A process that creates its OwnedDir under `parent`, prints the path, then runs `then`."""
    script = ("import os, sys, time\nfrom shared.owned_dirs import OwnedDir\n"
              f"d = OwnedDir.create({PREFIX!r}, {str(parent)!r})\nprint(d.path, flush=True)\n{then}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)


def made_by(proc: subprocess.Popen[str]) -> Path:
    assert proc.stdout is not None
    return Path(proc.stdout.readline().strip())


def test_a_killed_owners_folder_is_swept_and_a_live_owners_is_kept(tmp_path: Path) -> None:
    dead = owner(tmp_path, "os.kill(os.getpid(), 9)")  # no exit handler runs: the folder stays behind
    dead_dir = made_by(dead)
    dead.wait(30)
    live = owner(tmp_path, "time.sleep(60)")
    try:
        live_dir = made_by(live)
        mine = OwnedDir.create(PREFIX, str(tmp_path))
        assert dead_dir.is_dir() and owner_pid(dead_dir.name, PREFIX) == dead.pid
        assert sweep_stale(PREFIX, str(tmp_path)) == [dead_dir]
        assert not dead_dir.exists() and live_dir.is_dir() and mine.path.is_dir()
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(30)
    mine.remove()
    assert not mine.path.exists()
    mine.remove()  # idempotent


def test_a_dead_pid_whose_lock_is_held_is_kept(tmp_path: Path) -> None:
    """The pid may name nobody here yet the owner lives (another pid namespace sharing /tmp): its lock says so."""
    held = OwnedDir.create(PREFIX, str(tmp_path))
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(probe.stdout)
    renamed = held.path.with_name(f"{PREFIX}{dead_pid}-abc123")
    held.path.rename(renamed)
    assert owner_pid(renamed.name, PREFIX) == dead_pid
    assert sweep_stale(PREFIX, str(tmp_path)) == [] and renamed.is_dir()
    held.path = renamed
    held.remove()


def test_only_exact_names_of_real_folders_are_candidates(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / LOCK_NAME).touch()
    (tmp_path / f"{PREFIX}{pid}-link").symlink_to(target)  # a link is never followed into
    (tmp_path / f"{PREFIX}{pid}-file").touch()  # not a folder
    (tmp_path / f"{PREFIX}nopid").mkdir()  # made before pids were in the name: owner unknown
    (tmp_path / f"{PREFIX}{pid}-nolock").mkdir()  # no lock file: not made by OwnedDir
    before = sorted(p.name for p in tmp_path.iterdir())
    assert sweep_stale(PREFIX, str(tmp_path)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before and (target / LOCK_NAME).exists()
    assert owner_pid(f"{PREFIX}{pid}-x/../y", PREFIX) is None and owner_pid(f"other-{pid}-x", PREFIX) is None


def test_a_live_pid_keeps_its_folder_even_where_locks_do_not_hold(tmp_path: Path) -> None:
    """A filesystem may grant every flock (some network ones do): the live pid alone must then keep it."""
    alive = tmp_path / f"{PREFIX}{os.getppid()}-unlocked"
    alive.mkdir()
    (alive / LOCK_NAME).touch()  # nobody holds it
    assert sweep_stale(PREFIX, str(tmp_path)) == [] and alive.is_dir()
