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
