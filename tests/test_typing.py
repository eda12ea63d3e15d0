"""mypy stays clean over the parts listed in pyproject.toml's [tool.mypy] files (STYLE.md item 10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
