"""`pageserve admin install-units`: the units verify with systemd-analyze, name only commands and
modules that exist, carry the hardening, and the env files list every setting."""

from __future__ import annotations

import configparser
import importlib.util
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ops.admin import main as admin_main
from ops.units import UnitOptions, units

UNITS = ("pageserve-engine.service", "pageserve-gateway.service", "pageserve.target")


def parse_unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    assert admin_main(["install-units", "--root", str(root), "--memory-max", "8G"]) == 0
    return root


def test_files_written_with_modes(root: Path) -> None:
    for name in UNITS:
        assert (root / "etc/systemd/system" / name).stat().st_mode & 0o777 == 0o644
    for name in ("engine.env", "gateway.env"):
        assert (root / "etc/pageserve" / name).stat().st_mode & 0o777 == 0o640
    assert (root / "etc/sysusers.d/pageserve.conf").read_text().startswith("u pageserve ")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_units(root: Path) -> None:
    paths = [str(root / "etc/systemd/system" / n) for n in UNITS]
    r = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "pageserve" not in r.stderr, r.stderr


def test_every_command_and_module_the_units_name_exists(root: Path) -> None:
    for name in UNITS[:2]:
        service = parse_unit(root / "etc/systemd/system" / name)["Service"]
        commands = [v for k, v in service.items() if k.startswith("Exec")]
        assert commands
        for line in commands:
            argv = shlex.split(line)
            assert os.access(argv[0], os.X_OK), argv[0]
            if argv[1:2] == ["-m"]:
                assert importlib.util.find_spec(argv[2]) is not None, argv[2]


def test_units_are_ordered_hardened_and_restart(root: Path) -> None:
    gateway = parse_unit(root / "etc/systemd/system/pageserve-gateway.service")
    for name in UNITS[:2]:
        unit = parse_unit(root / "etc/systemd/system" / name)
        s = unit["Service"]
        assert "redis-server.service" in unit["Unit"]["After"] and "redis-server.service" in unit["Unit"]["Wants"]
        assert s["User"] == "pageserve" and s["Restart"] == "on-failure"
        for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                           "PrivateTmp": "yes", "MemoryMax": "8G"}.items():
            assert s[key] == value, (name, key)
        assert "AF_INET" in s["RestrictAddressFamilies"]
        assert unit["Install"]["WantedBy"] == "pageserve.target"
    assert "ops.ready_probe" in gateway["Service"]["ExecStartPost"]
    assert "pageserve-engine.service" in gateway["Unit"]["After"]
    target = parse_unit(root / "etc/systemd/system/pageserve.target")
    assert "pageserve-gateway.service" in target["Unit"]["Wants"]


def test_back_off_only_where_systemd_has_it() -> None:
    assert "RestartSteps" not in units(UnitOptions(systemd_version=252))["pageserve-engine.service"]
    assert "RestartSteps=" in units(UnitOptions(systemd_version=254))["pageserve-engine.service"]


def test_env_files_list_every_setting_and_are_kept(root: Path) -> None:
    from engine.serving.main import build_parser as engine_parser
    from gateway.server import build_parser as gateway_parser

    for name, parser in (("engine", engine_parser({})), ("gateway", gateway_parser({}))):
        text = (root / "etc/pageserve" / f"{name}.env").read_text()
        for action in parser._actions:
            if action.option_strings and hasattr(action, "pageserve_env"):
                assert f"#{action.pageserve_env}=" in text
        assert all(line.startswith("#") or not line for line in text.splitlines())  # nothing set by default
    env = root / "etc/pageserve/gateway.env"
    env.write_text("PAGESERVE_PORT=9999\n")
    assert admin_main(["install-units", "--root", str(root)]) == 0
    assert env.read_text() == "PAGESERVE_PORT=9999\n"  # an operator's settings survive a re-install


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        admin_main(["install-units", "--root", str(tmp_path), "--user", "root; rm -rf /"])
    with pytest.raises(SystemExit):
        admin_main(["install-units", "--root", str(tmp_path), "--memory-max", "lots"])
