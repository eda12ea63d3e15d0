"""`pageserve gateway` builds its frozen config from flags, then environment, then defaults."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig
from gateway.server import parse_args


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
