"""`pageserve gateway` builds its frozen config from flags, then environment, then defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import GatewayConfig
from gateway.server import parse_args

ROOT = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    assert parse_args([]) == GatewayConfig()


def test_environment_then_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGESERVE_ENGINE", "ipc:///tmp/engine.sock")
    monkeypatch.setenv("PAGESERVE_PORT", "9001")
    monkeypatch.setenv("PAGESERVE_REDIS_URL", "redis://10.0.0.5:6379/1")
    config = parse_args(["--port", "9002", "--model", "/models/llama"])
    assert config.engine_address == "ipc:///tmp/engine.sock"
    assert config.redis_url == "redis://10.0.0.5:6379/1"
    assert config.port == 9002 and config.model == "/models/llama"


def test_bad_port_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--port", "eighty"])
    assert e.value.code == 2


def test_a_one_worker_gateways_metrics_reach_the_multiprocess_files(tmp_path: Path) -> None:
    """`pageserve gateway` (one worker) prepares the metrics folder before prometheus_client is imported,
    so what the app counts is in the files /metrics reads (a fresh interpreter: nothing imported yet)."""
    script = (
        "from gateway.config import GatewayConfig\n"
        "from gateway.server import _metrics_dir\n"
        f"_metrics_dir(GatewayConfig(metrics_dir={str(tmp_path)!r}))\n"
        "from gateway.metrics import GatewayMetrics, render\n"
        "m = GatewayMetrics()\n"
        "m.requests.labels('acme', '/v1/completions', '200').inc()\n"
        "m.routing.event('retry')\n"
        "print(render(m).decode())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'pageserve:requests_total{route="/v1/completions",status="200",tenant="acme"} 1.0' in out.stdout
    assert "pageserve:router_retries_total 1.0" in out.stdout
