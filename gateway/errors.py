"""The gateway's error taxonomy and its OpenAI-shaped HTTP body.

Three kinds (STYLE.md item 12): a bad request (4xx, nothing reached the engine
or the engine goes on), an internal error of one request (500), the engine is
dead or unreachable (503). Every error leaves the gateway as
`{"error": {"message", "type", "param", "code"}}`, on a plain response or as one
SSE event once a stream has started. This module knows nothing about routes,
tokenizers or the engine client.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("pageserve.gateway")


class APIError(Exception):
    """An error the client is told about, with its HTTP status and OpenAI fields."""

    status_code: int = 400
    error_type: str = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else None
        return JSONResponse(self.body(), status_code=self.status_code, headers=headers)


class InvalidRequest(APIError):
    """400: the body or a parameter is wrong; `param` names the field."""


class AuthenticationError(APIError):
    """401: missing, unknown or revoked API key. Never echoes the key."""

    status_code = 401
    error_type = "authentication_error"


class PermissionDenied(APIError):
    status_code = 403
    error_type = "permission_error"


class NotFound(APIError):
    """404: an unknown model or route."""

    status_code = 404


class RateLimited(APIError):
    """429: a quota says no (raised by the tenancy admission hook)."""

    status_code = 429
    error_type = "rate_limit_error"


class InternalError(APIError):
    """500: this one request failed; the engine and other requests go on."""

    status_code = 500
    error_type = "internal_error"


class ServiceUnavailable(APIError):
    """503: a backing service (Redis) cannot be reached; retry later."""

    status_code = 503
    error_type = "service_unavailable"


class EngineUnavailable(ServiceUnavailable):
    """503: the engine is dead, shutting down or unreachable; every request is told."""

    error_type = "engine_unavailable"
    retry_after_s = 2
    """Sent as Retry-After: a restarted engine (systemd, `pageserve up`) is first started again after 2 s,
    and clients that honour the header (the OpenAI SDKs do) come back then instead of at once."""

    def response(self) -> JSONResponse:
        response = super().response()
        response.headers["Retry-After"] = str(self.retry_after_s)
        return response


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    """Last resort: an unexpected exception is a 500 for this request, never a crash."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return InternalError("internal error while handling the request", code="internal_error").response()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    kind = NotFound if exc.status_code == 404 else APIError
    return kind(str(exc.detail), code="not_found" if exc.status_code == 404 else None,
                status_code=exc.status_code).response()


async def tenancy_error_handler(request: Request, exc: Exception) -> Response:
    """Errors raised by gateway/tenancy: a quota refusal is a 429 with its headers, Redis down a 503."""
    from gateway.tenancy.errors import QuotaExceeded, TenancyUnavailable

    if isinstance(exc, QuotaExceeded):
        from gateway.request_context import record_of

        record = record_of(request)
        if record is not None:
            record.refusal = exc.limit or exc.limit_type
        return JSONResponse(exc.body(), status_code=429, headers=exc.headers)
    if isinstance(exc, TenancyUnavailable):
        return ServiceUnavailable(exc.message, code="service_unavailable").response()
    return InternalError(str(exc), code="tenancy_error").response()
