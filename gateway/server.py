"""`pageserve gateway`: flags and PAGESERVE_* environment -> GatewayConfig -> uvicorn.

    pageserve gateway --engine tcp://127.0.0.1:5555 --redis-url redis://127.0.0.1:6379/0 \\
                      --host 127.0.0.1 --port 8000 --model smollm2 --workers 2

Every flag has an environment twin (flags win; `--help` and the README's table
list them, `shared/cli_env.py`), so systemd units can use an EnvironmentFile.
Secrets come from the environment only (PAGESERVE_ADMIN_TOKEN), never a flag.
This module also prepares the process: logging (text or JSON), the
prometheus-client multiprocess folder (set before anything imports
prometheus_client, emptied at start, removed at every exit we control when it
was our own, and an earlier dead gateway's swept at start: shared/owned_dirs.py),
TLS and the worker count handed to uvicorn. Logic lives in the app.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from typing import Any

from gateway.config import ConfigError, GatewayConfig, ModelsConfig
from gateway.tenancy.admission import AdmissionConfig
from gateway.tenancy.errors import InvalidArgument
from shared.cli_env import add_env_twins
from shared.owned_dirs import OwnedDir, sweep_stale

DEFAULTS = GatewayConfig()
ENV_NAMES = {
    "engine": "PAGESERVE_ENGINE",
    "workers": "PAGESERVE_GATEWAY_WORKERS",
    "quota_lease": "PAGESERVE_QUOTA_LEASE_S",
    "metrics_dir": "PROMETHEUS_MULTIPROC_DIR",
}
"""Environment names kept from before (or standard); every other flag is PAGESERVE_<FLAG>."""
UVICORN_GRACE_S = 5
"""uvicorn's own wait for connections after our drain (gateway/lifecycle.py) already ended them."""
METRICS_DIR_PREFIX = "pageserve-metrics-"


class _Addresses(argparse.Action):
    """`--engine A --engine B,C` accumulate; the default (or the environment's value) is replaced by the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*(current if isinstance(current, list) else []), values])


def engine_addresses(values: list[str]) -> tuple[str, ...]:
    """`--engine A --engine B,C` -> (A, B, C), in order, without repeats or blanks."""
    found = [a.strip() for v in values for a in v.split(",") if a.strip()]
    return tuple(dict.fromkeys(found))


def _model_flags(p: argparse.ArgumentParser, d: GatewayConfig) -> None:
    """Which models the gateway serves, and their aliases and fallbacks (gateway/served_models.py)."""
    a = p.add_argument
    a("--model", action=_Addresses, default=d.model,
      help="model spec for the tokenizer; repeat it (or separate by commas) for each model the engines serve; "
      "the first is the default")
    a("--model-alias", action="append", default=[], metavar="NAME=MODEL",
      help="clients may ask for MODEL as NAME (repeatable; in the environment, separated by spaces)")
    a("--model-fallback", action="append", default=[], metavar="MODEL=A,B",
      help="when MODEL has no live engine, is cooling down or its context is too short, try A then B "
      "(repeatable; in the environment, separated by spaces)")
    a("--model-cooldown", type=float, default=d.models.cooldown_s,
      help="seconds a model whose engine failed a request is passed over for its fallbacks")
    a("--model-cost-weight", action="append", default=[], metavar="MODEL=W",
      help="MODEL's tokens count W times against tenant-wide token limits and budgets (repeatable; in the "
      "environment, separated by spaces)")


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    d = DEFAULTS
    p = argparse.ArgumentParser(prog="pageserve gateway", description="OpenAI-compatible HTTP gateway")
    a = p.add_argument
    a("--engine", action=_Addresses, default=d.engine_address,
      help="ZeroMQ address of an engine; repeat it or separate by commas for several replicas")
    a("--discover-engines", action="store_true", help="also route to the engines announced in Redis")
    a("--stall-timeout", type=float, default=d.replicas.stall_timeout_s,
      help="seconds without progress after which a replica leaves the live set")
    a("--redis-url", default=d.redis_url, help="Redis holding tenants, hashed keys and quotas (put a password "
      "in the environment, not on the command line)")
    a("--redis-prefix", default=d.redis_prefix, help="namespace of every Redis key")
    a("--redis-timeout", type=float, default=d.redis_timeout_s, help="seconds before a Redis call fails (503)")
    a("--redis-max-connections", type=int, default=d.redis_max_connections, help="Redis pool size per worker")
    a("--redis-pool-wait", type=float, default=d.redis_pool_wait_s,
      help="seconds a request waits for a pooled Redis connection")
    a("--host", default=d.host, help="address to listen on")
    a("--port", type=int, default=d.port, help="port to listen on")
    a("--workers", type=int, default=d.workers, help="gateway processes sharing the port")
    _model_flags(p, d)
    a("--engine-timeout", type=float, default=d.engine_connect_timeout_s,
      help="seconds to wait for the engine at start-up")
    a("--engine-retry-interval", type=float, default=d.engine_retry_interval_s,
      help="seconds between reconnection attempts after the engine was lost")
    a("--engine-poll-interval", type=float, default=d.engine_poll_interval_s,
      help="seconds between engine Stats polls (heartbeat and metrics)")
    a("--engine-stall", type=float, default=d.engine_stall_s,
      help="seconds without an engine step, with work in flight, before open requests fail")
    a("--drain-time", type=float, default=d.drain_s, help="seconds open requests get to finish after SIGTERM")
    a("--request-deadline", type=float, default=0.0, help="seconds after which a request is aborted; 0: none")
    a("--max-body-bytes", type=int, default=d.max_body_bytes, help="larger request bodies get a 413")
    a("--body-timeout", type=float, default=d.body_timeout_s,
      help="seconds a request body may take to arrive whole (after the key check), else a 408")
    a("--completion-default-max-tokens", type=int, default=d.completion_default_max_tokens,
      help="max_tokens of /v1/completions when the request gives none")
    a("--quota-lease", type=float, default=d.admission.lease_s,
      help="seconds a dead gateway's concurrency slots stay held")
    a("--quota-default-max-tokens", type=int, default=d.admission.default_max_tokens,
      help="output tokens reserved when a request gives no max_tokens")
    a("--trusted-request-id", action="store_true", help="use the client's x-request-id (behind a trusted proxy)")
    a("--cors-origins", default="", help="comma-separated browser origins allowed (CORS); empty: none")
    a("--tls-certfile", default=None, help="PEM certificate: serve HTTPS")
    a("--tls-keyfile", default=None, help="PEM private key of --tls-certfile")
    a("--metrics-dir", default=None, help="folder for the workers' metric files (emptied at start); "
      "default: a fresh temporary folder")
    a("--log-level", default=d.log_level, help="critical, error, warning, info or debug")
    a("--log-format", default=d.log_format, choices=["text", "json"], help="text, or one JSON object a line")
    a("--redis-down-fail-open", default="",
      help="comma-separated tenants served without quotas while Redis is down (default: none, every request 503)")
    a("--engine-curve-dir", default=None,
      help="ZeroMQ CURVE key folder for the engine socket (pageserve curve-keys): authenticate and encrypt")
    add_env_twins(p, "PAGESERVE_", ENV_NAMES, environ)
    return p


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> GatewayConfig:
    """Flags and environment to a checked config; ConfigError names the flag of a bad value."""
    a = build_parser(environ).parse_args(argv)
    env = os.environ if environ is None else environ
    try:
        admission = AdmissionConfig(lease_s=a.quota_lease, heartbeat_s=a.quota_lease / 3,
                                    default_max_tokens=a.quota_default_max_tokens)
    except InvalidArgument as e:
        raise ConfigError(f"invalid setting --quota-lease: {e}") from None
    # A list: --engine flags; a string: the environment's value, or the built-in default (not "given").
    listed = a.engine if isinstance(a.engine, list) else [] if a.engine == DEFAULTS.engine_address else [a.engine]
    given = engine_addresses(listed)
    engines = given or (DEFAULTS.engine_address,)
    # One engine keeps the single link; several, or discovery, the replica set (with the given ones only).
    replicas = dataclasses.replace(
        DEFAULTS.replicas, addresses=given if a.discover_engines or len(given) > 1 else (),
        discover=a.discover_engines, stall_timeout_s=a.stall_timeout)
    specs = engine_addresses(a.model if isinstance(a.model, list) else [a.model])  # env: "A,B"
    models = ModelsConfig(extra=specs[1:], aliases=dict(_pairs(a.model_alias, "--model-alias")),
                          fallbacks={k: tuple(x.strip() for x in v.split(",") if x.strip())
                                     for k, v in _pairs(a.model_fallback, "--model-fallback")},
                          cooldown_s=a.model_cooldown, cost_weights=_weights(a.model_cost_weight))
    return GatewayConfig(
        engine_address=engines[0], replicas=replicas, redis_url=a.redis_url, model=specs[0], models=models,
        host=a.host, port=a.port,
        redis_prefix=a.redis_prefix, engine_connect_timeout_s=a.engine_timeout,
        engine_retry_interval_s=a.engine_retry_interval,
        engine_poll_interval_s=a.engine_poll_interval, engine_stall_s=a.engine_stall,
        completion_default_max_tokens=a.completion_default_max_tokens, max_body_bytes=a.max_body_bytes,
        body_timeout_s=a.body_timeout,
        redis_timeout_s=a.redis_timeout, redis_max_connections=a.redis_max_connections,
        redis_pool_wait_s=a.redis_pool_wait, request_deadline_s=a.request_deadline or None,
        drain_s=a.drain_time, trusted_request_id=a.trusted_request_id,
        cors_origins=tuple(o.strip() for o in a.cors_origins.split(",") if o.strip()),
        tls_certfile=a.tls_certfile, tls_keyfile=a.tls_keyfile, metrics_dir=a.metrics_dir,
        log_level=a.log_level, log_format=a.log_format, workers=a.workers, admission=admission,
        engine_curve_dir=a.engine_curve_dir,
        redis_down_fail_open=frozenset(t.strip() for t in a.redis_down_fail_open.split(",") if t.strip()),
        admin_token=env.get("PAGESERVE_ADMIN_TOKEN") or None,  # env only: a flag would show in `ps`
    )


def _pairs(values: list[str] | str, flag: str) -> list[tuple[str, str]]:
    """`NAME=VALUE` flags (or the environment's "A=B C=D"); a ConfigError names the flag of one without '='."""
    out = []
    for v in values.split() if isinstance(values, str) else values:
        name, sep, value = v.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"invalid setting {flag}: expected NAME=VALUE, got {v!r}")
        out.append((name.strip(), value.strip()))
    return out


def _weights(values: list[str] | str) -> dict[str, float]:
    weights = {}
    for name, value in _pairs(values, "--model-cost-weight"):
        try:
            weights[name] = float(value)
        except ValueError:
            raise ConfigError(f"invalid setting --model-cost-weight: {value!r} is not a number") from None
        if not 0 < weights[name] <= 1000:
            raise ConfigError(f"invalid setting --model-cost-weight: {value} must be in (0, 1000]")
    return weights


_ARGV_ENV = "PAGESERVE_GATEWAY_ARGV"
"""How the command line reaches worker processes (uvicorn starts each one from an import string)."""


def app_from_env() -> Any:
    """uvicorn's app factory in each worker process: same flags, own lifespan and engine client."""
    from gateway.app import create_app
    from gateway.logging_setup import configure_logging

    config = parse_args(json.loads(os.environ[_ARGV_ENV]))
    configure_logging(config.log_level, config.log_format)  # type: ignore[arg-type]
    return create_app(config)


def _metrics_dir(config: GatewayConfig) -> OwnedDir | None:
    """The multiprocess folder, emptied, exported for the workers; the OwnedDir when it is ours to remove."""
    owned = None
    if config.metrics_dir:
        path = config.metrics_dir
    else:
        sweep_stale(METRICS_DIR_PREFIX)  # a killed gateway's folder: its owner is dead, nothing reads it
        owned = OwnedDir.create(METRICS_DIR_PREFIX)
        path = str(owned.path)
    # Set before gateway.metrics is imported: prometheus_client picks its value class (files shared by
    # workers, or process memory) when it is first imported; chosen wrongly, a one-worker gateway's
    # request metrics never reach /metrics, which reads the files.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    from gateway.metrics import clean_multiprocess_dir

    clean_multiprocess_dir(path)
    return owned


def _exit_cleanly_on_sigterm() -> None:
    """After a graceful stop uvicorn restores the handler it found and raises the SIGTERM it caught
    again; with the default handler that killed the process before `main`'s `finally` removed the
    metrics folder. Found instead: this one, which exits 0 through that `finally` (as the engine
    does after SIGTERM). A SIGTERM before uvicorn takes over (loading) exits the same way."""
    def leave(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)


def main(argv: list[str]) -> int:
    try:
        config = parse_args(argv)
        for path in (config.tls_certfile, config.tls_keyfile):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"invalid setting --tls-certfile/--tls-keyfile: {path} is not a file")
    except ConfigError as e:
        print(f"pageserve gateway: {e}", file=sys.stderr)
        return 2
    from gateway.logging_setup import configure_logging

    configure_logging(config.log_level, config.log_format)  # type: ignore[arg-type]
    _exit_cleanly_on_sigterm()
    owned = _metrics_dir(config)  # before gateway.app imports prometheus_client
    try:
        _serve(config, argv)
    finally:
        if owned is not None:
            owned.remove()
    return 0


def _serve(config: GatewayConfig, argv: list[str]) -> None:
    import uvicorn

    from gateway.app import create_app

    common: dict[str, Any] = {"host": config.host, "port": config.port, "log_level": config.log_level,
                              "log_config": None, "access_log": False, "lifespan": "on",
                              "timeout_graceful_shutdown": UVICORN_GRACE_S,
                              "ssl_certfile": config.tls_certfile, "ssl_keyfile": config.tls_keyfile}
    if config.workers > 1:
        os.environ[_ARGV_ENV] = json.dumps(argv)
        uvicorn.run("gateway.server:app_from_env", factory=True, workers=config.workers, **common)
    else:
        uvicorn.run(create_app(config), **common)
