"""`pageserve up --engines N`: N engine replicas, each on its own address, all given to the gateway."""

from __future__ import annotations

import pytest

from ops.launcher import engine_addresses, parse_args


def test_engines_get_consecutive_ports_from_engine_port() -> None:
    config = parse_args(["--engines", "3", "--engine-port", "7000"])
    assert engine_addresses(config) == ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]


def test_engines_get_distinct_free_ports_by_default() -> None:
    addresses = engine_addresses(parse_args(["--engines", "2"]))
    assert len(set(addresses)) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in addresses)


def test_one_engine_is_the_default_and_zero_is_refused() -> None:
    assert parse_args([]).engines == 1
    with pytest.raises(SystemExit):
        parse_args(["--engines", "0"])


def test_several_models_get_their_own_engines_behind_one_gateway():
    from ops.launcher import engine_command, gateway_command

    config = parse_args(["--model", "smollm2", "--model", "/models/tiny", "--engines", "2", "--engine-port", "7000"])
    assert config.models == ("smollm2", "/models/tiny")
    addresses = engine_addresses(config)
    assert len(addresses) == 4 and addresses[-1] == "tcp://127.0.0.1:7003"
    commands = [engine_command(["ps"], config, a, m) for a, m in zip(addresses, ["smollm2"] * 2 + ["/models/tiny"] * 2,
                                                                      strict=True)]
    assert [c[c.index("--model") + 1] for c in commands] == ["smollm2", "smollm2", "/models/tiny", "/models/tiny"]
    argv, _ = gateway_command(["ps"], config, ",".join(addresses), "redis://x")
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--model"] == ["smollm2", "/models/tiny"]
    assert parse_args([]).models == ("smollm2",)
