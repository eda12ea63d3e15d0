"""`pageserve bench sampler` runs (a tiny run: it is a benchmark, this only keeps it working)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench.sampler import main


def test_bench_sampler_prints_every_case_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sampler.json"
    assert main(["--rows", "2", "--rounds", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    cases = json.loads(out.read_text())
    assert "plain, transforms bypassed" in cases and len(cases) == 9
    assert all(name in table for name in cases) and all(t > 0 for t in cases.values())
