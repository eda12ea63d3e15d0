"""`pageserve admin` end to end against a real redis-server: every command in a subprocess at least once."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from gateway.tenancy import TenantStore, connect
from gateway.tenancy.admission import Admission
from ops.admin import main as admin_main

ALL_COMMANDS = {("tenant", c) for c in ("create", "list", "show", "suspend", "resume", "delete")} | {
    ("key", c) for c in ("create", "list", "revoke", "rotate")} | {
    ("quota", "set"), ("quota", "show"), ("usage", "show"), ("audit", "show")}


@dataclass
class AdminCLI:
    """Runs `pageserve admin`: the first use of each command in a subprocess, later uses in-process.

    Every command is thus proven end to end in its own process (the entry point, env vars, exit
    status), while repeated checks skip the ~0.5 s interpreter start on a 2-core machine.
    """

    redis_url: str
    prefix: str
    transcript: list[str] = field(default_factory=list)
    in_subprocess: set[tuple[str, str]] = field(default_factory=set)

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        command = (args[0], args[1]) if len(args) > 1 else (args[0], "")
        if command in self.in_subprocess:
            proc = self._in_process(args)
        else:
            self.in_subprocess.add(command)
            env = {**os.environ, "PAGESERVE_REDIS_URL": self.redis_url, "PAGESERVE_REDIS_PREFIX": self.prefix}
            proc = subprocess.run([sys.executable, "-m", "ops.cli", "admin", *args], env=env,
                                  capture_output=True, text=True, timeout=60)
        self.transcript.append(proc.stdout + proc.stderr)
        if ok:
            assert proc.returncode == 0, proc.stderr
        return proc

    def _in_process(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = admin_main(["--redis-url", self.redis_url, "--prefix", self.prefix, *args])
        return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

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


def _authenticates(cli: AdminCLI, key: str) -> bool:
    async def check() -> bool:
        client = connect(cli.redis_url)
        try:
            return await TenantStore(client, cli.prefix).authenticate(key) is not None
        finally:
            await client.aclose()

    return asyncio.run(check())


def _serve_one(cli: AdminCLI, key: str, prompt: int, completion: int) -> None:
    async def run() -> None:
        client = connect(cli.redis_url)
        try:
            auth = await TenantStore(client, cli.prefix).authenticate(key)
            assert auth is not None
            admission = Admission(client, cli.prefix)
            await (await admission.admit(auth, prompt, 64)).settle(prompt, completion)
            await admission.aclose()
        finally:
            await client.aclose()

    asyncio.run(run())


def _key_from(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("ps-"))


def _quota_commands(cli: AdminCLI, key_id: str) -> None:
    """quota set / show: an override, "unlimited", then back to the tier default; per key; bad values."""
    shown = cli.json("quota", "set", "acme", "--rpm", "5", "--daily-tokens", "unlimited")
    assert shown["limits"]["rpm"] == 5 and shown["limits"]["daily_tokens"] is None
    assert shown["overrides"] == ["daily_tokens", "rpm"]
    assert "rpm             5 *" in cli("quota", "show", "acme").stdout
    assert cli.json("quota", "set", "acme", "--rpm", "default")["limits"]["rpm"] == 600  # standard tier
    assert cli.json("quota", "set", "acme", "--key", key_id, "--concurrency", "3")["limits"]["concurrency"] == 3
    assert cli.json("quota", "show", "acme", "--key", key_id)["overrides"] == ["concurrency"]
    bad = cli("quota", "set", "acme", "--rpm", "-4", ok=False)
    assert bad.returncode == 1 and "must be >= 0" in bad.stderr
    assert cli("quota", "set", "acme", ok=False).returncode == 1


def _usage_commands(cli: AdminCLI, key: str, key_id: str) -> None:
    """usage show, per tenant and per key, text and JSON, with a date range."""
    _serve_one(cli, key, 11, 7)
    _serve_one(cli, key, 4, 2)
    rows = cli.json("usage", "show", "acme")["rows"]
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(2, 15, 9)]
    assert cli.json("usage", "show", "--key", key_id)["rows"][0]["key_id"] == key_id
    by_key = cli.json("usage", "show", "acme", "--by-key")["rows"]
    assert [(r["key_id"], r["tenant"], r["requests"]) for r in by_key] == [(key_id, "acme", 2)]
    day = rows[0]["day"]
    assert cli.json("usage", "show", "--since", day, "--until", day)["rows"] == rows
    assert cli.json("usage", "show", "acme", "--since", "2020-01-01", "--until", "2020-01-31")["rows"] == []
    assert "acme" in cli("usage", "show").stdout
    assert cli("usage", "show", "--since", "yesterday", ok=False).returncode == 1


def _key_life_commands(cli: AdminCLI, key: str, key_id: str) -> list[str]:
    """Suspend and resume a tenant, rotate a key with a grace period, revoke it, delete a tenant with its
    keys: every key stops exactly when it should. Returns the keys it created."""
    cli("tenant", "suspend", "acme")  # suspension stops every key at once; resume restores them
    assert not _authenticates(cli, key)
    assert cli.json("tenant", "show", "acme")["status"] == "suspended"
    cli("tenant", "resume", "acme")
    assert _authenticates(cli, key)

    rotated = cli.json("key", "rotate", key_id, "--grace", "1.5")  # the old key works during the grace
    new_key = rotated["key"]
    assert rotated["replaces"] == key_id and _authenticates(cli, key) and _authenticates(cli, new_key)
    time.sleep(1.7)
    assert not _authenticates(cli, key) and _authenticates(cli, new_key)
    states = {k["id"]: k["usable"] for k in cli.json("key", "list", "acme")}
    assert states == {key_id: False, rotated["id"]: True}

    cli("key", "revoke", rotated["id"])
    assert not _authenticates(cli, new_key)
    third = _key_from(cli("key", "create", "beta").stdout)
    cli("tenant", "delete", "beta")
    assert not _authenticates(cli, third)
    assert cli("tenant", "show", "beta", ok=False).returncode == 1
    return [new_key, third]


def test_every_admin_command_end_to_end(cli: AdminCLI):
    cli("tenant", "create", "acme")
    cli("tenant", "create", "beta", "--tier", "free")
    assert [t["name"] for t in cli.json("tenant", "list")] == ["acme", "beta"]
    created = cli.json("key", "create", "acme", "--label", "prod")
    key, key_id = created["key"], created["id"]
    assert _authenticates(cli, key)
    _quota_commands(cli, key_id)
    _usage_commands(cli, key, key_id)
    later_keys = _key_life_commands(cli, key, key_id)

    actions = [e["action"] for e in cli.json("audit", "show", "--limit", "100")]
    assert actions == ["tenant.create", "tenant.create", "key.create", "quota.set", "quota.set", "quota.set",
                       "tenant.suspend", "tenant.resume", "key.create", "key.rotate", "key.revoke",
                       "key.create", "tenant.delete"]
    assert cli.in_subprocess >= ALL_COMMANDS  # each command ran at least once as its own process
    for secret in (key, *later_keys):  # keys appear only in the one output that created them
        showing = [t for t in cli.transcript if secret in t]
        assert len(showing) == 1, f"a key was printed {len(showing)} times"


def test_model_lists_model_limits_and_usage_by_model(cli: AdminCLI):
    """tenant create --models / tenant models / quota --model / usage --by-model (issue 42)."""
    assert cli.json("tenant", "create", "everyone")["models"] == ["*"]  # the default: every model
    assert cli.json("tenant", "create", "nobody", "--models", "")["models"] == []
    assert cli.json("tenant", "create", "acme", "--models", "smollm2")["models"] == ["smollm2"]
    assert cli.json("tenant", "models", "acme", "--allow", "tiny", "--allow", "smollm2")["models"] == [
        "smollm2", "tiny"]
    assert "may use smollm2, tiny" in cli("tenant", "models", "acme").stdout
    assert cli.json("tenant", "models", "acme", "--none")["models"] == []
    assert cli.json("tenant", "models", "acme", "--all")["models"] == ["*"]
    assert cli("tenant", "models", "acme", "--all", "--none", ok=False).returncode == 1
    shown = cli.json("quota", "set", "acme", "--model", "tiny", "--rpm", "7")
    assert shown["scope"] == "tenant acme on model tiny" and shown["limits"]["rpm"] == 7
    assert shown["limits"]["concurrency"] is None  # a model scope has no tier defaults
    assert cli("quota", "set", "acme", "--model", "tiny", "--key", "key_x", "--rpm", "1", ok=False).returncode == 1

    async def serve(model: str, prompt: int, completion: int) -> None:
        client = connect(cli.redis_url)
        try:
            store = TenantStore(client, cli.prefix)
            key, _ = await store.create_key("acme")
            auth = await store.authenticate(key)
            assert auth is not None
            admission = Admission(client, cli.prefix)
            await (await admission.admit(auth, prompt, 64, model=model)).settle(prompt, completion)
            await admission.aclose()
        finally:
            await client.aclose()

    asyncio.run(serve("tiny", 5, 3))
    asyncio.run(serve("smollm2", 2, 1))
    rows = cli.json("usage", "show", "acme", "--by-model")["rows"]
    assert [(r["model"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("smollm2", 1, 2, 1), ("tiny", 1, 5, 3)]
    assert cli("usage", "show", "--by-model", ok=False).returncode == 1
    assert cli.json("tenant", "aliases", "acme", "--set", "fast=tiny", "--set", "x=smollm2")["aliases"] == {
        "fast": "tiny", "x": "smollm2"}
    assert cli.json("tenant", "aliases", "acme", "--unset", "x")["aliases"] == {"fast": "tiny"}
    assert "fast -> tiny" in cli("tenant", "aliases", "acme").stdout
    assert cli("tenant", "aliases", "acme", "--set", "broken", ok=False).returncode == 1
