"""Temporary folders owned by one process: named after it, removed by it, swept once it is dead.

    d = OwnedDir.create("pageserve-metrics-")   # $TMPDIR/pageserve-metrics-<pid>-<random>, locked
    ...
    d.remove()                                   # on every exit the process controls
    sweep_stale("pageserve-metrics-")            # at the next start: earlier owners' folders, if dead

A folder is only ever swept when all of these hold, so a live process's folder is never touched:
its name is exactly `<prefix><pid>-<mkdtemp suffix>`; it is a real folder (not a link) owned by
this user; the pid is not ours and `os.kill(pid, 0)` says no such process; and the lock file inside
(held with `flock` for the owner's whole life, released by the kernel however it dies) can be taken.
The lock covers what the pid cannot: a pid seen from another pid namespace sharing this /tmp, and a
dead owner's pid reused. Folders made before this rule (no pid in the name) are left alone.
Nothing here knows what the folders hold.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

LOCK_NAME = ".owner.lock"
"""Inside each folder; neither prometheus-client (*.db) nor gloo's FileStore reads other names."""


class OwnedDir:
    """A fresh folder this process owns, locked until `remove()` or the process's end."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, prefix: str, parent: str | None = None) -> OwnedDir:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)  # not inherited by children
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd)

    def remove(self) -> None:
        """Idempotent: the folder and everything in it, then the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def owner_pid(name: str, prefix: str) -> int | None:
    """The pid in a folder name `OwnedDir.create(prefix)` made; None for any other name."""
    match = re.fullmatch(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]+", name)
    return int(match.group(1)) if match else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _lock_free(path: Path) -> bool:
    """True when nobody holds the folder's lock (its owner is gone); a folder without one is not ours."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def is_stale(path: Path, prefix: str) -> bool:
    """Whether `path` is a folder of a dead owner that may be removed (the module docstring's rule)."""
    pid = owner_pid(path.name, prefix)
    if pid is None or pid == os.getpid():
        return False
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    return not process_alive(pid) and _lock_free(path)


def sweep_stale(prefix: str, parent: str | None = None) -> list[Path]:
    """Remove the folders of dead owners under `parent` (default: the temp directory); returns them."""
    root = Path(parent or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for path in root.iterdir():
            if path.name.startswith(prefix) and is_stale(path, prefix):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed

