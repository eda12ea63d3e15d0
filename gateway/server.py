"""`pageserve gateway`: build the config from flags and environment, serve with uvicorn.

    pageserve gateway --engine tcp://127.0.0.1:5555 --redis-url redis://127.0.0.1:6379/0 \\
                      --host 127.0.0.1 --port 8000 --model smollm2

Every flag has a PAGESERVE_* environment variable (flags win), so systemd units
can use an EnvironmentFile. Logic lives in the app; this is the entry point only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from gateway.config import GatewayConfig
from gateway.tenancy.admission import AdmissionConfig

DEFAULTS = GatewayConfig()


def parse_args(argv: list[str]) -> GatewayConfig:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="pageserve gateway", description="OpenAI-compatible HTTP gateway")
    p.add_argument("--engine", action="append", default=None,
                   help="ZeroMQ address of an engine; repeat it or separate by commas for several replicas "
                        "(env PAGESERVE_ENGINE)")
    p.add_argument("--discover-engines", action="store_true",
                   default=env("PAGESERVE_DISCOVER_ENGINES", "") not in ("", "0"),
                   help="also route to the engines announced in Redis (env PAGESERVE_DISCOVER_ENGINES=1)")
    p.add_argument("--stall-timeout", type=float, default=DEFAULTS.replicas.stall_timeout_s,
                   help="seconds without progress after which a replica leaves the live set")
    p.add_argument("--redis-url", default=env("PAGESERVE_REDIS_URL", DEFAULTS.redis_url),
                   help="Redis holding tenants and hashed keys (env PAGESERVE_REDIS_URL)")
    p.add_argument("--host", default=env("PAGESERVE_HOST", DEFAULTS.host))
    p.add_argument("--port", type=int, default=int(env("PAGESERVE_PORT", str(DEFAULTS.port))))
    p.add_argument("--model", default=env("PAGESERVE_MODEL", DEFAULTS.model),
                   help="model spec for the tokenizer; must be what the engine serves (env PAGESERVE_MODEL)")
    p.add_argument("--redis-prefix", default=env("PAGESERVE_REDIS_PREFIX", DEFAULTS.redis_prefix))
    p.add_argument("--engine-timeout", type=float, default=DEFAULTS.engine_connect_timeout_s,
                   help="seconds to wait for the engine at start-up")
    p.add_argument("--log-level", default=env("PAGESERVE_LOG_LEVEL", DEFAULTS.log_level))
    p.add_argument("--workers", type=int, default=int(env("PAGESERVE_GATEWAY_WORKERS", str(DEFAULTS.workers))),
                   help="gateway processes sharing the port; each is its own engine client (env "
                        "PAGESERVE_GATEWAY_WORKERS)")
    quota = DEFAULTS.admission
    p.add_argument("--quota-lease", type=float, default=float(env("PAGESERVE_QUOTA_LEASE_S", str(quota.lease_s))),
                   help="seconds a dead gateway's concurrency slots stay held (env PAGESERVE_QUOTA_LEASE_S)")
    p.add_argument("--quota-default-max-tokens", type=int,
                   default=int(env("PAGESERVE_QUOTA_DEFAULT_MAX_TOKENS", str(quota.default_max_tokens))),
                   help="output tokens reserved when a request gives no max_tokens")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error("--workers must be at least 1")
    given = engine_addresses(a.engine or [env("PAGESERVE_ENGINE", "")])
    engines = given or (DEFAULTS.engine_address,)
    # One engine keeps the single link; several, or discovery, the replica set (with the given ones only).
    replicas = given if a.discover_engines or len(given) > 1 else ()
    return GatewayConfig(
        engine_address=engines[0],
        replicas=dataclasses.replace(DEFAULTS.replicas, addresses=replicas, discover=a.discover_engines,
                                     stall_timeout_s=a.stall_timeout),
        redis_url=a.redis_url,
        model=a.model,
        host=a.host,
        port=a.port,
        redis_prefix=a.redis_prefix,
        engine_connect_timeout_s=a.engine_timeout,
        log_level=a.log_level,
        workers=a.workers,
        admission=AdmissionConfig(lease_s=a.quota_lease, heartbeat_s=a.quota_lease / 3,
                                  default_max_tokens=a.quota_default_max_tokens),
        admin_token=env("PAGESERVE_ADMIN_TOKEN") or None,  # env only: a flag would show in `ps`
    )


def engine_addresses(values: list[str]) -> tuple[str, ...]:
    """`--engine A --engine B,C` -> (A, B, C), in order, without repeats or blanks."""
    found = [a.strip() for v in values for a in v.split(",") if a.strip()]
    return tuple(dict.fromkeys(found))


_ARGV_ENV = "PAGESERVE_GATEWAY_ARGV"
"""How the command line reaches worker processes (uvicorn starts each one from an import string)."""


def _configure_logging(config: GatewayConfig) -> None:
    import logging

    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def app_from_env() -> Any:
    """uvicorn's app factory in each worker process: same flags, own lifespan and engine client."""
    from gateway.app import create_app

    config = parse_args(json.loads(os.environ[_ARGV_ENV]))
    _configure_logging(config)
    return create_app(config)


def main(argv: list[str]) -> int:
    import uvicorn

    from gateway.app import create_app

    config = parse_args(argv)
    _configure_logging(config)
    # access_log off: request lines carry no keys, but per-token streams make it noise at load.
    common: dict[str, Any] = {"host": config.host, "port": config.port, "log_level": config.log_level,
                              "access_log": False, "lifespan": "on", "timeout_graceful_shutdown": 5}
    if config.workers > 1:
        os.environ[_ARGV_ENV] = json.dumps(argv)
        uvicorn.run("gateway.server:app_from_env", factory=True, workers=config.workers, **common)
    else:
        uvicorn.run(create_app(config), **common)
    return 0
