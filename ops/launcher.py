"""`pageserve up`: redis-server, the engine and the gateway on 127.0.0.1, with one command.

    pageserve up [--model smollm2] [--port 8000] [--redis-url URL] [--engine-port N] [--tenant demo]
                 [--engines N]                # N engine replicas behind the gateway (ports from --engine-port)
                 [--engine tcp://HOST:PORT]   # use an engine that is already running instead

Starts a private redis-server on a free port unless `--redis-url` is given,
then the engine and the gateway as child processes (`pageserve engine`,
`pageserve gateway`), waits until `GET /health` answers 200, creates the demo
tenant (or reuses it) and a fresh API key through the tenancy store, and prints
the key and a working `curl` line. Ctrl-C or SIGTERM stops the gateway, then the
engine, then redis, each with a grace period; if any child dies on its own the
others are stopped too and the exit status is 1.

Children run in their own sessions, so a terminal's Ctrl-C reaches only this
process and the shutdown order stays ours. This module owns process supervision
only: no HTTP handling, no model code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from shared.model_store import DEFAULT_MODEL

HEALTH_TIMEOUT_S = 600.0
"""First start converts the GGUF (tens of seconds on 2 cores) before the engine loads it."""
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class LaunchConfig:
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    """The gateway's HTTP port."""
    redis_url: str | None = None
    """None: start a private redis-server on a free port."""
    engine_port: int | None = None
    """None: a free port (each replica its own); N: replicas on N, N+1, ..."""
    engines: int = 1
    """Engine replicas to start; the gateway routes between them (gateway/replicas/)."""
    engine_address: str | None = None
    """An engine already running there is used; None: start one."""
    engine_args: tuple[str, ...] = ()
    """Extra flags passed to `pageserve engine` as is."""
    tensor_parallel_size: int = 1
    """Passed to each engine as --tensor-parallel-size (1: the flag is left out)."""
    tenant: str = "demo"
    redis_prefix: str = "ps"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    cleanup: list[str] = field(default_factory=list)
    """Temporary folders to delete once the process is gone."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(name: str, argv: list[str], quiet: bool = False, env: dict[str, str] | None = None) -> Child:
    # start_new_session: the terminal's Ctrl-C reaches only the launcher, which stops children in order.
    out = subprocess.DEVNULL if quiet else None
    full_env = None if env is None else {**os.environ, **env}
    return Child(name, subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=out, env=full_env))


def gateway_command(cli: list[str], config: LaunchConfig, engine_address: str,
                    redis_url: str) -> tuple[list[str], dict[str, str]]:
    """The gateway's argv and extra environment. The Redis URL (it may hold a password) goes by
    environment: argv is readable by every local user (`ps`, /proc/PID/cmdline)."""
    argv = [*cli, "gateway", "--engine", engine_address, "--host", config.host, "--port", str(config.port),
            "--model", config.model, "--redis-prefix", config.redis_prefix, "--engine-timeout", str(HEALTH_TIMEOUT_S)]
    return argv, {"PAGESERVE_REDIS_URL": redis_url}


def start_redis() -> tuple[Child, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("pageserve up: redis-server is not installed (apt-get install redis-server), "
                         "or pass --redis-url")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="pageserve-redis-")
    child = _spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir], quiet=True)  # failures show as no port
    child.cleanup.append(workdir)
    _wait_for_port(child, port, timeout_s=10.0)
    return child, f"redis://127.0.0.1:{port}/0"


def _wait_for_port(child: Child, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} did not start on port {port}") from None
            time.sleep(0.05)


def wait_healthy(url: str, children: list[Child], timeout_s: float) -> None:
    """Poll GET /health until 200; fail early when a child exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with status {c.proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no healthy answer from {url} within {timeout_s:g} s")


async def create_demo_key(redis_url: str, prefix: str, tenant: str) -> str:
    """A fresh key for the demo tenant (created on first use); printed once, never stored in clear."""
    from gateway.tenancy import TenantExists, TenantStore, connect

    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=prefix, actor="pageserve-up")
        with contextlib.suppress(TenantExists):  # a second `up` on the same Redis reuses the tenant
            await store.create_tenant(tenant)
        key, _ = await store.create_key(tenant, label="pageserve up")
        return key
    finally:
        await redis.aclose()


def stop_all(children: list[Child]) -> None:
    """Stop in reverse start order: gateway, engine, redis. SIGTERM, then SIGKILL after the grace."""
    for c in reversed(children):
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
            try:
                c.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"pageserve up: {c.name} did not stop in {STOP_GRACE_S:g} s; killing it", file=sys.stderr)
                c.proc.kill()
                c.proc.wait()
        for path in c.cleanup:
            shutil.rmtree(path, ignore_errors=True)


def engine_addresses(config: LaunchConfig) -> list[str]:
    """Where each local replica listens: consecutive ports from --engine-port, else free ones."""
    if config.engine_port is not None:
        return [f"tcp://127.0.0.1:{config.engine_port + i}" for i in range(config.engines)]
    return [f"tcp://127.0.0.1:{free_port()}" for _ in range(config.engines)]


def curl_line(host: str, port: int, key: str, model: str) -> str:
    """The first request a user sends: greedy, so it shows the model's most likely answer (at OpenAI's
    default temperature 1, SmolLM2-135M's first token here is a coin flip between 'The', 'L' and 'La')."""
    body = json.dumps({"model": model, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    return (f"curl -N http://{host}:{port}/v1/chat/completions -H 'Authorization: Bearer {key}' "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")


def parse_args(argv: list[str]) -> LaunchConfig:
    p = argparse.ArgumentParser(prog="pageserve up", description="serve locally: redis, engine and gateway")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--redis-url", default=os.environ.get("PAGESERVE_REDIS_URL"))
    p.add_argument("--engine-port", type=int, default=None)
    p.add_argument("--engines", type=int, default=1, metavar="N", help="start N engine replicas (default 1)")
    p.add_argument("--engine", default=None, metavar="ADDRESS",
                   help="use the engine already listening at this ZeroMQ address instead of starting one")
    p.add_argument("--engine-args", default="", help="extra flags for `pageserve engine`, as one string")
    p.add_argument("--tenant", default="demo", help="the demo tenant that gets a fresh key")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="each engine runs as N processes sharing every layer (pageserve engine's flag)")
    a = p.parse_args(argv)
    if a.engines < 1:
        p.error("--engines must be at least 1")
    return LaunchConfig(model=a.model, host=a.host, port=a.port, redis_url=a.redis_url,
                        engine_port=a.engine_port, engines=a.engines, engine_address=a.engine, engine_args=tuple(shlex.split(a.engine_args)),
                        tenant=a.tenant, tensor_parallel_size=a.tensor_parallel_size)


def engine_command(cli: list[str], config: LaunchConfig, address: str) -> list[str]:
    tp = ["--tensor-parallel-size", str(config.tensor_parallel_size)] if config.tensor_parallel_size != 1 else []
    return [*cli, "engine", "--model", config.model, "--listen", address, *tp, *config.engine_args]


def main(argv: list[str]) -> int:
    config = parse_args(argv)
    stop_requested = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    children: list[Child] = []
    try:
        return _run(config, children, lambda: stop_requested)
    except RuntimeError as e:
        print(f"pageserve up: {e}", file=sys.stderr)
        return 1
    finally:
        stop_all(children)


def _run(config: LaunchConfig, children: list[Child], stopping: Callable[[], bool]) -> int:
    from gateway.tenancy.redis_conn import redact_url  # redis' client loads only when serving

    cli = [sys.executable, "-m", "ops.cli"]
    redis_url = config.redis_url
    if redis_url is None:
        redis, redis_url = start_redis()
        children.append(redis)
    engine_address = config.engine_address
    if engine_address is None:
        addresses = engine_addresses(config)
        for i, address in enumerate(addresses):
            name = "engine" if len(addresses) == 1 else f"engine-{i}"
            children.append(_spawn(name, engine_command(cli, config, address)))
        engine_address = ",".join(addresses)
    gateway_argv, gateway_env = gateway_command(cli, config, engine_address, redis_url)
    children.append(_spawn("gateway", gateway_argv, env=gateway_env))
    wait_healthy(f"http://{config.host}:{config.port}/health", children, HEALTH_TIMEOUT_S)
    key = asyncio.run(create_demo_key(redis_url, config.redis_prefix, config.tenant))
    print(f"\npageserve is up: http://{config.host}:{config.port}  (model {config.model}, redis {redact_url(redis_url)})")
    print(f"API key for tenant {config.tenant!r} (shown once):\n  {key}\n")
    print(curl_line(config.host, config.port, key, config.model))
    print("\nCtrl-C stops redis, the engine(s) and the gateway.", flush=True)
    while not stopping():
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with status {c.proc.returncode}; stopping the others")
        time.sleep(0.2)
    return 0
