"""The app factory: `create_app(config) -> Starlette`, no global state.

The lifespan opens the services (`gateway/state.py`: engine link, tokenizer,
Redis pool and tenancy store), hands them to every request as
`request.state.gateway`, and closes them on shutdown; it also takes SIGTERM
over so that the worker drains first (`gateway/lifecycle.py`). Every request
passes the request-context middleware (x-request-id, access log, metrics,
refusal while draining) and, when origins are configured, CORS. Errors of every
kind leave as OpenAI-shaped bodies (`gateway/errors.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from gateway.admin_routes import admin_routes
from gateway.config import GatewayConfig
from gateway.errors import (
    APIError,
    api_error_handler,
    http_error_handler,
    tenancy_error_handler,
    unhandled_error_handler,
)
from gateway.lifecycle import Lifecycle
from gateway.lora_admin import lora_admin_routes
from gateway.metrics import GatewayMetrics
from gateway.ops_routes import ops_routes
from gateway.replicas import observe_routing
from gateway.request_context import RequestContextMiddleware
from gateway.routes import ROUTES
from gateway.state import GatewayState, open_services
from gateway.tenancy.errors import TenancyError
from shared.gc_pauses import freeze_startup_objects

ServicesFactory = Callable[[GatewayConfig], AbstractAsyncContextManager[GatewayState]]


def create_app(config: GatewayConfig, services: ServicesFactory = open_services) -> Starlette:
    """Build the gateway app; `services` is replaced by fakes only in unit tests."""
    metrics = GatewayMetrics()
    engine_holder: list[GatewayState] = []

    def fail_open(reason: str) -> None:
        for state in engine_holder:
            state.engine.fail_open(reason)

    lifecycle = Lifecycle(config.drain_s, fail_open)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, GatewayState]]:
        async with services(config) as state:
            engine_holder.append(state)
            observe_routing(state.engine, metrics.routing)  # with replicas: their routing on /metrics
            client = state.engine.client  # vLLM's series at 0 from the first scrape, under the served name
            metrics.prime(client.model_info.model_name if client is not None else config.model)
            lifecycle.install()
            freeze_startup_objects()  # no full collection walks the tokenizer's or Starlette's objects
            yield {"gateway": state}

    middleware = [Middleware(RequestContextMiddleware, metrics=metrics, lifecycle=lifecycle,
                             trusted_request_id=config.trusted_request_id)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["authorization", "content-type"],
                                     expose_headers=["x-request-id"]))
    app = Starlette(
        routes=[*ROUTES, *ops_routes(metrics, lifecycle), *lora_admin_routes(config.admin_token),
                admin_routes(config.admin_token)],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            APIError: api_error_handler,
            HTTPException: http_error_handler,
            TenancyError: tenancy_error_handler,
            Exception: unhandled_error_handler,
        },
    )
    app.state.lifecycle = lifecycle
    app.state.metrics = metrics
    return app
