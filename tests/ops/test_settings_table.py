"""One table of settings: docs/operations.md == the parsers' own flags; every flag has a working env twin;
a bad value stops start-up naming the setting."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.config import ConfigError, GatewayConfig
from gateway.server import build_parser, main, parse_args
from ops.settings_table import SETTINGS_DOC, readme_with_tables


def test_the_docs_settings_tables_are_the_generated_ones() -> None:
    text = SETTINGS_DOC.read_text()
    assert readme_with_tables(text) == text, "docs/operations.md settings drifted: run python -m ops.settings_table --write"


def test_every_gateway_config_field_is_reachable_from_the_environment() -> None:
    env = {
        "PAGESERVE_ENGINE": "ipc:///run/e.sock", "PAGESERVE_REDIS_URL": "redis://r:1/2", "PAGESERVE_MODEL": "/m",
        "PAGESERVE_HOST": "0.0.0.0", "PAGESERVE_PORT": "9000", "PAGESERVE_REDIS_PREFIX": "x",
        "PAGESERVE_QUOTA_LEASE_S": "60", "PAGESERVE_QUOTA_DEFAULT_MAX_TOKENS": "100",
        "PAGESERVE_ADMIN_TOKEN": "t", "PAGESERVE_ENGINE_TIMEOUT": "5", "PAGESERVE_ENGINE_RETRY_INTERVAL": "2",
        "PAGESERVE_ENGINE_POLL_INTERVAL": "3", "PAGESERVE_ENGINE_STALL": "9",
        "PAGESERVE_COMPLETION_DEFAULT_MAX_TOKENS": "7", "PAGESERVE_MAX_BODY_BYTES": "2048",
        "PAGESERVE_REDIS_TIMEOUT": "4", "PAGESERVE_REDIS_MAX_CONNECTIONS": "8", "PAGESERVE_REDIS_POOL_WAIT": "1",
        "PAGESERVE_REQUEST_DEADLINE": "120", "PAGESERVE_DRAIN_TIME": "10", "PAGESERVE_TRUSTED_REQUEST_ID": "yes",
        "PAGESERVE_CORS_ORIGINS": "https://a.example, https://b.example", "PAGESERVE_TLS_CERTFILE": "/c.pem",
        "PAGESERVE_TLS_KEYFILE": "/k.pem", "PROMETHEUS_MULTIPROC_DIR": "/run/m", "PAGESERVE_LOG_LEVEL": "debug",
        "PAGESERVE_LOG_FORMAT": "json", "PAGESERVE_GATEWAY_WORKERS": "4",
        "PAGESERVE_BODY_TIMEOUT": "12", "PAGESERVE_DISCOVER_ENGINES": "1",
        "PAGESERVE_REDIS_DOWN_FAIL_OPEN": "acme", "PAGESERVE_ENGINE_CURVE_DIR": "/etc/pageserve/curve",
        "PAGESERVE_MODEL_ALIAS": "chat=/m", "PAGESERVE_MODEL_FALLBACK": "/m=other",
        "PAGESERVE_MODEL_COOLDOWN": "3",
    }
    config = parse_args([], env)
    default = GatewayConfig()
    unchanged = [f.name for f in dataclasses.fields(GatewayConfig)
                 if getattr(config, f.name) == getattr(default, f.name)]
    assert unchanged == []
    assert config.cors_origins == ("https://a.example", "https://b.example") and config.request_deadline_s == 120


def test_flags_win_over_the_environment() -> None:
    assert parse_args(["--drain-time", "3"], {"PAGESERVE_DRAIN_TIME": "10"}).drain_s == 3


@pytest.mark.parametrize("env,named", [
    ({"PAGESERVE_PORT": "eighty"}, "PAGESERVE_PORT"),
    ({"PAGESERVE_LOG_FORMAT": "xml"}, "PAGESERVE_LOG_FORMAT"),
    ({"PAGESERVE_TRUSTED_REQUEST_ID": "maybe"}, "PAGESERVE_TRUSTED_REQUEST_ID"),
])
def test_a_bad_environment_value_names_the_variable(env: dict[str, str], named: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser(env)
    assert e.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [
    (["--drain-time", "-1"], "--drain-time"), (["--workers", "0"], "--workers"),
    (["--engine-stall", "0.5"], "--engine-stall"), (["--tls-certfile", "/c.pem"], "--tls-certfile"),
    (["--max-body-bytes", "10"], "--max-body-bytes"), (["--port", "70000"], "--port"),
    (["--quota-lease", "0"], "--quota-lease"),
])
def test_an_out_of_range_value_stops_start_up_naming_the_flag(argv: list[str], flag: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args(argv, {})
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


def test_engine_flags_have_twins_and_bad_values_name_them(capsys: pytest.CaptureFixture[str]) -> None:
    from engine.serving.main import build_parser as engine_parser

    args = engine_parser({"PAGESERVE_MODEL": "/m", "PAGESERVE_ENGINE_KV_CACHE_MEMORY": "3.5",
                          "PAGESERVE_ENGINE_NO_PREFIX_CACHING": "true", "PAGESERVE_ENGINE_DTYPE": "bfloat16"}).parse_args([])
    assert (args.model, args.kv_cache_memory, args.no_prefix_caching, args.dtype) == ("/m", 3.5, True, "bfloat16")
    with pytest.raises(SystemExit):
        engine_parser({"PAGESERVE_ENGINE_DTYPE": "int3"})
    assert "PAGESERVE_ENGINE_DTYPE" in capsys.readouterr().err
    help_text = engine_parser({}).format_help()
    assert "PAGESERVE_ENGINE_MAX_NUM_SEQS" in help_text
