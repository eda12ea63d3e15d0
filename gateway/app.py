"""The app factory: `create_app(config) -> Starlette`, no global state.

The lifespan opens the services (`gateway/state.py`: engine link, tokenizer,
Redis pool and tenancy store), hands them to every request as
`request.state.gateway`, and closes them on shutdown. Errors of every kind
leave as OpenAI-shaped bodies (`gateway/errors.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from gateway.admin_routes import admin_routes
from gateway.config import GatewayConfig
from gateway.errors import (
    APIError,
    api_error_handler,
    http_error_handler,
    tenancy_error_handler,
    unhandled_error_handler,
)
from gateway.routes import ROUTES
from gateway.state import GatewayState, open_services
from gateway.tenancy.errors import TenancyError

ServicesFactory = Callable[[GatewayConfig], AbstractAsyncContextManager[GatewayState]]


def create_app(config: GatewayConfig, services: ServicesFactory = open_services) -> Starlette:
    """Build the gateway app; `services` is replaced by fakes only in unit tests."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, GatewayState]]:
        async with services(config) as state:
            yield {"gateway": state}

    return Starlette(
        routes=[*ROUTES, admin_routes(config.admin_token)],
        lifespan=lifespan,
        exception_handlers={
            APIError: api_error_handler,
            HTTPException: http_error_handler,
            TenancyError: tenancy_error_handler,
            Exception: unhandled_error_handler,
        },
    )
