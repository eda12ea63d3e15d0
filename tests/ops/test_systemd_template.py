"""The engine template unit: instance %i listens on base port + %i, its own env file can override."""

from __future__ import annotations

import subprocess
from pathlib import Path

UNIT = Path(__file__).parents[2] / "ops" / "systemd" / "pageserve-engine@.service"


def exec_start(instance: int) -> str:
    """The ExecStart command as systemd would run it (continuations joined, %i substituted)."""
    text = UNIT.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").replace("%i", str(instance))


def run(instance: int, env: dict[str, str]) -> str:
    command = exec_start(instance).replace("/opt/pageserve/.venv/bin/pageserve", "echo")
    base = {"PAGESERVE_MODEL": "smollm2", "PAGESERVE_ENGINE_ARGS": "--threads 2",
            "PAGESERVE_ENGINE_BASE_PORT": "5555", "PAGESERVE_ENGINE_HOST": "127.0.0.1", "PATH": "/usr/bin:/bin"}
    args = command.split(" ", 2)  # /bin/sh -c '<script>'
    assert args[:2] == ["/bin/sh", "-c"]
    script = args[2].strip().strip("'")
    return subprocess.run(["/bin/sh", "-c", script], env={**base, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_each_instance_listens_on_its_own_port() -> None:
    assert run(0, {}) == "engine --model smollm2 --listen tcp://127.0.0.1:5555 --threads 2"
    assert run(3, {}) == "engine --model smollm2 --listen tcp://127.0.0.1:5558 --threads 2"


def test_an_instance_env_file_may_set_the_address() -> None:
    assert run(1, {"PAGESERVE_ENGINE_LISTEN": "tcp://10.0.0.7:6000"}).startswith(
        "engine --model smollm2 --listen tcp://10.0.0.7:6000")


def test_each_instance_reads_its_own_env_file_after_the_shared_one() -> None:
    lines = UNIT.read_text().splitlines()
    files = [x for x in lines if x.startswith("EnvironmentFile=")]
    assert files == ["EnvironmentFile=-/etc/pageserve/engine.env", "EnvironmentFile=-/etc/pageserve/engine-%i.env"]
