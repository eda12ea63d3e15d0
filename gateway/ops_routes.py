"""Operator endpoints: GET /ready, /version and /metrics (no key needed; /health is in routes.py).

    /ready    200 only when the engine is connected and making progress, Redis answers and
              this worker is not draining; otherwise 503 with a body naming each problem.
              A load balancer's readiness check and the systemd unit's start probe use it.
    /version  the package and wire-protocol versions and the model served.
    /metrics  Prometheus text format (gateway/metrics.py).

They hold nothing secret: no tenant names, no keys (replica labels are engine addresses).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.lifecycle import Lifecycle
from gateway.metrics import EngineCollector, GatewayMetrics, render
from gateway.replicas import replica_loads
from gateway.routing_metrics import ReplicaCollector
from gateway.state import get_state
from shared.protocol import PROTOCOL_VERSION

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def package_version() -> str:
    try:
        return importlib.metadata.version("pageserve")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def ops_routes(metrics: GatewayMetrics, lifecycle: Lifecycle) -> list[Route]:
    async def ready(request: Request) -> Response:
        state = get_state(request)
        problems: list[str] = []
        if lifecycle.draining:
            problems.append("draining: the gateway is shutting down")
        engine = state.engine
        if engine.client is None:
            problems.append(f"engine: not connected{'; ' + engine.last_failure if engine.last_failure else ''}")
        elif not engine.progressing:
            problems.append("engine: connected but making no progress")
        if not await state.redis.ping():
            problems.append("redis: unreachable")
        body: dict[str, Any] = {"status": "ready" if not problems else "not ready", "problems": problems}
        return JSONResponse(body, status_code=503 if problems else 200)

    async def version(request: Request) -> Response:
        client = get_state(request).engine.client
        return JSONResponse({
            "version": package_version(),
            "protocol_version": PROTOCOL_VERSION,
            "model": client.model_info.model_name if client is not None else None,
        })

    async def metrics_route(request: Request) -> Response:
        state = get_state(request)

        def latest() -> tuple[Any, str, bool]:
            client = state.engine.client
            model = client.model_info.model_name if client is not None else state.config.model
            return state.engine.latest_stats, model, state.engine.progressing

        replicas = ReplicaCollector(lambda: replica_loads(state.engine))
        return Response(render(metrics, EngineCollector(latest), replicas), media_type=METRICS_CONTENT_TYPE)

    return [
        Route("/ready", ready, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
