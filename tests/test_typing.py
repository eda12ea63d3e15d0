"""mypy stays clean over the parts listed in pyproject.toml's [tool.mypy] files (STYLE.md item 10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.model_store import cache_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    # mypy's incremental cache beside the model store's (shared/model_store.py): a fresh clone on a host that
    # ran it before checks only what changed (entries are validated by each file's hash), 37 s -> a few.
    cache = cache_dir() / "mypy" / f"py{sys.version_info.major}.{sys.version_info.minor}"
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
