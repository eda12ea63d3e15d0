"""`pageserve gateway --engine A --engine B,C` and `--discover-engines` choose the replica set."""

from __future__ import annotations

import pytest

from gateway.server import parse_args


def test_one_engine_keeps_the_single_link() -> None:
    config = parse_args(["--engine", "tcp://10.0.0.1:5555"])
    assert config.engine_address == "tcp://10.0.0.1:5555" and not config.replicas.enabled


def test_repeated_and_comma_separated_engines_are_replicas() -> None:
    config = parse_args(["--engine", "tcp://a:1", "--engine", "tcp://b:2, tcp://c:3,tcp://a:1", "--stall-timeout", "2"])
    assert config.replicas.addresses == ("tcp://a:1", "tcp://b:2", "tcp://c:3")
    assert config.replicas.enabled and config.replicas.stall_timeout_s == 2


def test_environment_lists_replicas_and_turns_discovery_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGESERVE_ENGINE", "tcp://a:1,tcp://b:2")
    assert parse_args([]).replicas.addresses == ("tcp://a:1", "tcp://b:2")
    monkeypatch.delenv("PAGESERVE_ENGINE")
    monkeypatch.setenv("PAGESERVE_DISCOVER_ENGINES", "1")
    config = parse_args([])
    assert config.replicas.discover and config.replicas.enabled and config.replicas.addresses == ()
