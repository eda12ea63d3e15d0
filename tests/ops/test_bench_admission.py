"""`pageserve bench admission` runs end to end (a tiny run: it is a benchmark, this only keeps it working)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_admission_prints_a_table_and_writes_json(tmp_path: Path):
    out = tmp_path / "admission.json"
    proc = subprocess.run([sys.executable, "-m", "ops.cli", "bench", "admission", "--requests", "60",
                           "--seconds", "0.5", "--concurrency", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for row in ("authenticate+admit (1 trip)", "settle (after the response)", "redis PING", "empty script",
                "before: authenticate", "throughput"):
        assert row in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("before: authenticate")  # a table comes last
    result = json.loads(out.read_text())
    waits = result["latency"]["authenticate+admit"]
    assert 0 < waits["p50_ms"] <= waits["p99_ms"]
    assert result["throughput_rps"] > 0 and result["script_us_per_call"] > 0
    assert result["gateway"] is None


def test_bench_admission_through_the_gateway_with_a_noop_engine(tmp_path: Path):
    out = tmp_path / "admission.json"
    proc = subprocess.run([sys.executable, "-m", "ops.cli", "bench", "admission", "--requests", "20",
                           "--seconds", "0.5", "--concurrency", "4", "--gateway", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "request failed" not in proc.stdout + proc.stderr
    gateway = json.loads(out.read_text())["gateway"]
    assert gateway["on"]["rps"] > 0 and gateway["off"]["rps"] > 0
    assert set(gateway["inside"]) == {"authenticate+admit", "settle"}  # timed inside the gateway process
    assert proc.stdout.rstrip().splitlines()[-1].startswith("in gateway: settle")
