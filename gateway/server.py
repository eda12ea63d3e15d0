"""`pageserve gateway`: build the config from flags and environment, serve with uvicorn.

    pageserve gateway --engine tcp://127.0.0.1:5555 --redis-url redis://127.0.0.1:6379/0 \\
                      --host 127.0.0.1 --port 8000 --model smollm2

Every flag has a PAGESERVE_* environment variable (flags win), so systemd units
can use an EnvironmentFile. Logic lives in the app; this is the entry point only.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from gateway.config import GatewayConfig
from gateway.tenancy.admission import AdmissionConfig

DEFAULTS = GatewayConfig()


def parse_args(argv: list[str]) -> GatewayConfig:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="pageserve gateway", description="OpenAI-compatible HTTP gateway")
    p.add_argument("--engine", default=env("PAGESERVE_ENGINE", DEFAULTS.engine_address),
                   help="ZeroMQ address of the engine (env PAGESERVE_ENGINE)")
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
    p.add_argument("--redis-down-fail-open", default=env("PAGESERVE_REDIS_DOWN_FAIL_OPEN", ""),
                   help="comma-separated tenants served without quotas while Redis is down (default: none, "
                        "every request gets 503; env PAGESERVE_REDIS_DOWN_FAIL_OPEN)")
    p.add_argument("--engine-curve-dir", default=env("PAGESERVE_ENGINE_CURVE_DIR"),
                   help="ZeroMQ CURVE key folder for the engine socket (env PAGESERVE_ENGINE_CURVE_DIR)")
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
    return GatewayConfig(
        engine_address=a.engine,
        redis_url=a.redis_url,
        model=a.model,
        host=a.host,
        port=a.port,
        redis_prefix=a.redis_prefix,
        engine_connect_timeout_s=a.engine_timeout,
        engine_curve_dir=a.engine_curve_dir,
        redis_down_fail_open=frozenset(t.strip() for t in a.redis_down_fail_open.split(",") if t.strip()),
        log_level=a.log_level,
        workers=a.workers,
        admission=AdmissionConfig(lease_s=a.quota_lease, heartbeat_s=a.quota_lease / 3,
                                  default_max_tokens=a.quota_default_max_tokens),
        admin_token=env("PAGESERVE_ADMIN_TOKEN") or None,  # env only: a flag would show in `ps`
    )


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
