"""`pageserve up`: redis-server, the engine and the gateway on 127.0.0.1, with one command.

    pageserve up [--model smollm2] [--port 8000] [--redis-url URL] [--engine-port N] [--tenant demo]
                 [--engines N]                # N engine replicas behind the gateway (ports from --engine-port)
                 [--model A --model B]        # several models behind one gateway: N engines for each
                 [--engine tcp://HOST:PORT]   # use an engine that is already running instead
                 [--crash-loop-count 5] [--crash-loop-window 60] [--log-dir DIR]

Starts a private redis-server on a free port unless `--redis-url` is given,
then the engine(s) and the gateway as child processes (`pageserve engine`,
`pageserve gateway`), waits until `GET /health` answers 200, creates the demo
tenant (or reuses it) and a fresh API key through the tenancy store, and prints
the key and a working `curl` line. Each engine writes to its own log file.

It supervises as the systemd units do: an engine that dies is started again on
its address with the units' back-off (ops/supervisor.py) and the gateway
rejoins it, routing to the live replicas meanwhile (one engine: 503 with
Retry-After). An engine that dies within --crash-loop-window seconds of its
start --crash-loop-count times in a row stops everything (exit status 1, its
log named). The gateway or the private redis-server dying stops everything too
(exit status 1). Ctrl-C or SIGTERM stops the gateway, then the engines, then
redis, each with a grace period (exit status 0).

This module owns the command and its start-up; ops/children.py the processes,
ops/engine_group.py the engines' restarts. No HTTP handling, no model code.
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
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from ops.children import (  # Child, stop_all: benchmarks import them from here
    STOP_GRACE_S,
    Child,
    spawn,
    stop_all,
)
from ops.engine_group import EngineGroup, EngineReplica
from ops.supervisor import RestartPolicy, RestartTracker
from shared.model_store import DEFAULT_MODEL

HEALTH_TIMEOUT_S = 600.0
"""First start converts the GGUF (tens of seconds on 2 cores) before the engine loads it."""


@dataclass(frozen=True)
class LaunchConfig:
    model: str = DEFAULT_MODEL
    """The first (default) model."""
    more_models: tuple[str, ...] = ()
    """Further models (`--model` repeated): each gets its own `engines` replicas behind the one gateway."""
    host: str = "127.0.0.1"
    port: int = 8000
    """The gateway's HTTP port."""
    redis_url: str | None = None
    """None: start a private redis-server on a free port."""
    engine_port: int | None = None
    """None: a free port (each replica its own); N: replicas on N, N+1, ..."""
    engines: int = 1
    """Engine replicas to start per model; the gateway routes between them (gateway/replicas/)."""

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.more_models)
    engine_address: str | None = None
    """An engine already running there is used; None: start one."""
    engine_args: tuple[str, ...] = ()
    """Extra flags passed to `pageserve engine` as is."""
    tensor_parallel_size: int = 1
    """Passed to each engine as --tensor-parallel-size (1: the flag is left out)."""
    tenant: str = "demo"
    redis_prefix: str = "ps"
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    """When a dead engine is started again, and when a crash loop stops `up`."""
    log_dir: str | None = None
    """Where each engine's log goes (NAME.log); None: a fresh temporary folder, kept after exit."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_command(cli: list[str], config: LaunchConfig, engine_address: str,
                    redis_url: str) -> tuple[list[str], dict[str, str]]:
    """The gateway's argv and extra environment. The Redis URL (it may hold a password) goes by
    environment: argv is readable by every local user (`ps`, /proc/PID/cmdline)."""
    argv = [*cli, "gateway", "--engine", engine_address, "--host", config.host, "--port", str(config.port),
            *(x for m in config.models for x in ("--model", m)), "--redis-prefix", config.redis_prefix,
            "--engine-timeout", str(HEALTH_TIMEOUT_S)]
    return argv, {"PAGESERVE_REDIS_URL": redis_url}


def start_redis() -> tuple[Child, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("pageserve up: redis-server is not installed (apt-get install redis-server), "
                         "or pass --redis-url")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="pageserve-redis-")
    child = spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
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


def wait_healthy(url: str, children: list[Child], timeout_s: float, tick: Callable[[], None] | None = None) -> None:
    """Poll GET /health until 200; fail early when a child exits (or when `tick`, called every poll, raises)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
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


def engine_addresses(config: LaunchConfig) -> list[str]:
    """Where each local replica listens (model by model): consecutive ports from --engine-port, else free ones."""
    total = config.engines * len(config.models)
    if config.engine_port is not None:
        return [f"tcp://127.0.0.1:{config.engine_port + i}" for i in range(total)]
    return [f"tcp://127.0.0.1:{free_port()}" for _ in range(total)]


def curl_line(host: str, port: int, key: str, model: str) -> str:
    """The first request a user sends: greedy, so it shows the model's most likely answer (at OpenAI's
    default temperature 1, SmolLM2-135M's first token here is a coin flip between 'The', 'L' and 'La')."""
    body = json.dumps({"model": model, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    return (f"curl -N http://{host}:{port}/v1/chat/completions -H 'Authorization: Bearer {key}' "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")


def parse_args(argv: list[str]) -> LaunchConfig:
    p = argparse.ArgumentParser(prog="pageserve up", description="serve locally: redis, engine and gateway")
    p.add_argument("--model", action="append", default=None,
                   help=f"model to serve (default {DEFAULT_MODEL}); repeat it for several models behind one gateway")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--redis-url", default=os.environ.get("PAGESERVE_REDIS_URL"))
    p.add_argument("--engine-port", type=int, default=None)
    p.add_argument("--engines", type=int, default=1, metavar="N",
                   help="start N engine replicas of each model (default 1)")
    p.add_argument("--engine", default=None, metavar="ADDRESS",
                   help="use the engine already listening at this ZeroMQ address instead of starting one")
    p.add_argument("--engine-args", default="", help="extra flags for `pageserve engine`, as one string")
    p.add_argument("--tenant", default="demo", help="the demo tenant that gets a fresh key")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="each engine runs as N processes sharing every layer (pageserve engine's flag)")
    default = RestartPolicy()
    p.add_argument("--crash-loop-count", type=int, default=default.crash_loop_count, metavar="N",
                   help="a dead engine is started again after the systemd units' back-off (2 s, doubling to 120 s); "
                        f"one that dies within --crash-loop-window of its start N times in a row stops `up` with "
                        f"exit status 1 instead (default {default.crash_loop_count})")
    p.add_argument("--crash-loop-window", type=float, default=default.crash_loop_window_s, metavar="SECONDS",
                   help="an engine that dies within this many seconds of its start counts towards "
                        f"--crash-loop-count (default {default.crash_loop_window_s:g})")
    p.add_argument("--log-dir", default=None, help="where each engine's log goes, NAME.log (default: a new "
                   "temporary folder, printed at start, removed after a clean stop, kept when up fails)")
    a = p.parse_args(argv)
    if a.engines < 1:
        p.error("--engines must be at least 1")
    try:
        restart = RestartPolicy(crash_loop_count=a.crash_loop_count, crash_loop_window_s=a.crash_loop_window)
    except ValueError as e:
        p.error(str(e).replace("crash_loop_count", "--crash-loop-count").replace("crash_loop_window_s",
                                                                                  "--crash-loop-window"))
    models = a.model or [DEFAULT_MODEL]
    if a.engine and len(models) > 1:
        p.error("--engine (one running engine) serves one model; leave it out to start several models")
    return LaunchConfig(model=models[0], more_models=tuple(models[1:]), host=a.host, port=a.port, redis_url=a.redis_url, engine_port=a.engine_port,
                        engines=a.engines, engine_address=a.engine, engine_args=tuple(shlex.split(a.engine_args)),
                        tenant=a.tenant, tensor_parallel_size=a.tensor_parallel_size, restart=restart,
                        log_dir=a.log_dir)


def engine_command(cli: list[str], config: LaunchConfig, address: str, model: str | None = None) -> list[str]:
    tp = ["--tensor-parallel-size", str(config.tensor_parallel_size)] if config.tensor_parallel_size != 1 else []
    return [*cli, "engine", "--model", model or config.model, "--listen", address, *tp, *config.engine_args]


UNSERVED_GRACE_S = 2.0
"""How long `up` lets a gateway that never served stop before killing it."""


@dataclass
class Running:
    """What `up` started, in start order (stopped in reverse: gateway, engines, redis)."""

    redis: list[Child] = field(default_factory=list)
    engines: EngineGroup | None = None
    gateway: list[Child] = field(default_factory=list)
    serving: bool = False
    """The gateway answered /health: from then on it has streams to drain when stopped."""
    temp_logs: Path | None = None
    """The engines' log folder when `up` made it in the temp directory: removed after a clean stop
    (nothing left behind), kept when `up` fails, since its message names a log there."""

    def children(self) -> list[Child]:
        return [*self.redis, *(self.engines.children() if self.engines else []), *self.gateway]

    def check(self) -> None:
        """Raise when the gateway or the private redis-server died (that ends `up`); restart dead engines."""
        for c in (*self.redis, *self.gateway):
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with status {c.proc.returncode}; stopping the others")
        if self.engines is not None:
            self.engines.tick()


def main(argv: list[str]) -> int:
    config = parse_args(argv)
    stop_requested = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    running = Running()
    status = 1
    try:
        status = _run(config, running, lambda: stop_requested)
        return status
    except RuntimeError as e:  # CrashLoop too
        print(f"pageserve up: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        # A gateway that never served has nothing to drain, and while it waits for its first engine it
        # does not hear SIGTERM (uvicorn's start-up): a short grace, not the drain's.
        stop_all(running.children(), STOP_GRACE_S if running.serving else UNSERVED_GRACE_S)
        if status == 0 and running.temp_logs is not None:
            shutil.rmtree(running.temp_logs, ignore_errors=True)


def start_engines(config: LaunchConfig, cli: list[str], log_dir: Path) -> EngineGroup:
    """Each replica on its address, logging to its own file; printed so a user can find both."""
    log_dir.mkdir(parents=True, exist_ok=True)
    addresses = engine_addresses(config)
    models = [m for m in config.models for _ in range(config.engines)]  # addresses go model by model
    several = len(config.models) > 1
    names = (["engine"] if len(addresses) == 1 else
             [f"engine-{i // config.engines}-{i % config.engines}" if several else f"engine-{i}"
              for i in range(len(addresses))])
    group = EngineGroup([EngineReplica(name, address, engine_command(cli, config, address, model),
                                       log_dir / f"{name}.log", RestartTracker(config.restart))
                         for name, address, model in zip(names, addresses, models, strict=True)])
    group.start()
    for r in group.replicas:
        assert r.child is not None
        print(f"{r.name}: {r.address}  pid {r.child.proc.pid}  log {r.log}", flush=True)
    return group


def _run(config: LaunchConfig, running: Running, stopping: Callable[[], bool]) -> int:
    from gateway.tenancy.redis_conn import redact_url  # redis' client loads only when serving

    cli = [sys.executable, "-m", "ops.cli"]
    redis_url = config.redis_url
    if redis_url is None:
        redis, redis_url = start_redis()
        running.redis.append(redis)
    engine_address = config.engine_address
    if engine_address is None:
        log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix="pageserve-up-"))
        running.temp_logs = None if config.log_dir else log_dir
        running.engines = start_engines(config, cli, log_dir)
        engine_address = ",".join(r.address for r in running.engines.replicas)
    gateway_argv, gateway_env = gateway_command(cli, config, engine_address, redis_url)
    running.gateway.append(spawn("gateway", gateway_argv, env=gateway_env))
    wait_healthy(f"http://{config.host}:{config.port}/health", [], HEALTH_TIMEOUT_S, tick=running.check)
    running.serving = True
    key = asyncio.run(create_demo_key(redis_url, config.redis_prefix, config.tenant))
    print(f"\npageserve is up: http://{config.host}:{config.port}  (model {', '.join(config.models)}, "
          f"redis {redact_url(redis_url)})")
    print(f"API key for tenant {config.tenant!r} (shown once):\n  {key}\n")
    print(curl_line(config.host, config.port, key, config.model))
    print("\nA dead engine is started again; Ctrl-C stops redis, the engine(s) and the gateway.", flush=True)
    while not stopping():
        running.check()
        time.sleep(0.2)
    return 0
