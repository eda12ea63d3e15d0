"""`pageserve admin` end to end: a subprocess per command against a real redis-server."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest


@dataclass
class AdminCLI:
    redis_url: str
    prefix: str
    transcript: list[str] = field(default_factory=list)

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PAGESERVE_REDIS_URL": self.redis_url, "PAGESERVE_REDIS_PREFIX": self.prefix}
        proc = subprocess.run([sys.executable, "-m", "ops.cli", "admin", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        self.transcript.append(proc.stdout + proc.stderr)
        if ok:
            assert proc.returncode == 0, proc.stderr
        return proc

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def cli(redis_url: str) -> AdminCLI:
    return AdminCLI(redis_url, "cli" + secrets.token_hex(4))


def test_tenant_create_and_key_create_print_the_key_once(cli: AdminCLI):
    out = cli("tenant", "create", "acme", "--tier", "premium").stdout
    assert "created tenant acme" in out and "premium" in out
    out = cli("key", "create", "acme", "--label", "ci").stdout
    key = next(line for line in out.splitlines() if line.startswith("ps-"))
    assert "shown only this once" in out
    listing = cli("key", "list", "acme").stdout + cli("tenant", "show", "acme").stdout
    assert key not in listing and key[-4:] in listing  # the hint, never the key
    assert key not in cli("audit", "show").stdout


def test_errors_have_exit_codes_and_clear_messages(cli: AdminCLI):
    cli("tenant", "create", "acme")
    dup = cli("tenant", "create", "acme", ok=False)
    assert dup.returncode == 1 and "already exists" in dup.stderr
    missing = cli("key", "create", "ghost", ok=False)
    assert missing.returncode == 1 and "'ghost' does not exist" in missing.stderr
    assert cli("tenant", "frobnicate", ok=False).returncode == 2
    down = subprocess.run([sys.executable, "-m", "ops.cli", "admin", "--redis-url",
                           "redis://:hunter2@127.0.0.1:1/0", "tenant", "list"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 3 and "Redis is unreachable" in down.stderr
    assert "hunter2" not in down.stderr and "Traceback" not in down.stderr
