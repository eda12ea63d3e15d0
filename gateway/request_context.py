"""Every HTTP request's id, record, access-log line and metrics: one ASGI middleware.

    x-request-id   on every response: our own (a uuid4 hex), or the client's when the
                   gateway sits behind a proxy it trusts (`trusted_request_id`) and the
                   value is a plain token; the engine request id embeds it, so the
                   engine's per-request log line carries it too (`engine_request_id`)
    RequestRecord  filled as the request goes (tenant after admission, token times,
                   usage, refusal kind); read once when the response is done
    access log     one line per request on logger "pageserve.access" with id, tenant,
                   route, status, tokens, timings and outcome (JSON fields with
                   `--log-format json`); never the prompt, never a key
    draining       new requests get 503 + Retry-After while the worker drains
                   (gateway/lifecycle.py); probes and /metrics still answer

It wraps the app as plain ASGI (no buffering): a stream passes through untouched.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics, RequestObservation

access_log = logging.getLogger("pageserve.access")

REQUEST_ID_HEADER = "x-request-id"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A proxy's id is used only if it is a plain token (it ends up in logs and engine request ids)."""
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics", "/version"})
"""Answered while draining; they are not generation traffic."""
GENERATION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass
class RequestRecord:
    request_id: str
    trusted_id: bool
    """The id came from a trusted proxy (it may repeat: the engine id gets a unique suffix)."""
    route: str
    method: str
    started: float = field(default_factory=time.perf_counter)
    tenant: str = "-"
    model_name: str = ""
    engine_request_id: str = ""
    status: int = 0
    outcome: str = ""
    refusal: str = ""
    admission_s: float | None = None
    submitted: bool = False
    first_token_at: float | None = None
    last_token_at: float | None = None
    token_intervals_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    queue_s: float | None = None
    """The engine's queue time (arrival at the engine to first scheduling), from its Finished."""

    def engine_id(self, prefix: str) -> str:
        """The engine request id (and completion id) that carries this request's x-request-id."""
        rid = f"{prefix}{self.request_id}"
        if self.trusted_id:
            rid += "." + uuid.uuid4().hex[:8]
        self.engine_request_id = rid
        return rid

    def on_tokens(self, num_tokens: int) -> None:
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None and num_tokens > 0:
            interval = (now - self.last_token_at) / num_tokens
            self.token_intervals_s.extend([interval] * num_tokens)
        self.last_token_at = now

    def on_end(self, prompt: int, completion: int, cached: int, outcome: str, reasons: list[str]) -> None:
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = prompt, completion, cached
        self.outcome = outcome
        self.finish_reasons = [r for r in reasons if r in ("stop", "length")]

    def on_queued(self, seconds: float) -> None:
        if self.queue_s is None:  # every sample reports the same request's queue time
            self.queue_s = seconds

    def observation(self, e2e_s: float) -> RequestObservation:
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        return RequestObservation(
            route=self.route, status=self.status, tenant=self.tenant, model_name=self.model_name, e2e_s=e2e_s,
            ttft_s=ttft, token_intervals_s=self.token_intervals_s, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, cached_tokens=self.cached_tokens,
            finish_reasons=self.finish_reasons, admission_s=self.admission_s, refusal=self.refusal,
            generated=self.submitted, queue_s=self.queue_s,
        )

    def log_fields(self, e2e_s: float) -> dict[str, Any]:
        ttft = None if self.first_token_at is None else round(self.first_token_at - self.started, 4)
        return {
            "request_id": self.request_id, "engine_request_id": self.engine_request_id or None,
            "method": self.method, "route": self.route, "status": self.status, "tenant": self.tenant,
            "outcome": self.outcome or ("refused" if self.refusal else "ok" if self.status < 400 else "error"),
            "refusal": self.refusal or None, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
            "ttft_s": ttft, "duration_s": round(e2e_s, 4),
            "admission_s": None if self.admission_s is None else round(self.admission_s, 5),
        }


def _route_label(scope: Scope) -> str:
    """The matched route's template (bounded label values: never a client's raw path), or "other"."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else "other"


def record_of(request: Request) -> RequestRecord | None:
    """The request's record (None in apps built without the middleware, e.g. some unit tests)."""
    record = request.scope.get("state", {}).get("record")
    return record if isinstance(record, RequestRecord) else None


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, lifecycle: Lifecycle,
                 trusted_request_id: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.trusted_request_id = trusted_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = self._new_record(scope)
        scope.setdefault("state", {})["record"] = record
        id_header = (REQUEST_ID_HEADER.encode(), record.request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message["headers"] = [*message.get("headers", []), id_header]
            await send(message)

        if self.lifecycle.draining and record.route not in PROBE_PATHS:
            await self._refuse_draining(send_with_id)
            self._finish(record)
            return
        generation = record.route in GENERATION_ROUTES
        self.lifecycle.request_started()
        if generation:
            self.metrics.active_streams.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            record.status = record.status or 500
            raise
        finally:
            if generation:
                self.metrics.active_streams.dec()
            self.lifecycle.request_done()
            record.route = _route_label(scope)
            self._finish(record)

    def _new_record(self, scope: Scope) -> RequestRecord:
        given = None
        if self.trusted_request_id:
            for name, value in scope.get("headers", []):
                if name == REQUEST_ID_HEADER.encode():
                    text = value.decode("latin-1")
                    given = text if _SAFE_ID.match(text) else None
                    break
        path = scope.get("path", "")
        route = path if path in GENERATION_ROUTES or path in PROBE_PATHS else "other"
        return RequestRecord(request_id=given or uuid.uuid4().hex, trusted_id=given is not None, route=route,
                             method=scope.get("method", ""))

    async def _refuse_draining(self, send: Send) -> None:
        body = json.dumps({"error": {"message": "the gateway is shutting down; retry the request",
                                     "type": "service_unavailable", "param": None, "code": "shutting_down"}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"retry-after", str(self.lifecycle.retry_after_s()).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _finish(self, record: RequestRecord) -> None:
        e2e = time.perf_counter() - record.started
        try:
            self.metrics.observe(record.observation(e2e))
        except Exception:  # a metrics failure must never fail the request
            access_log.exception("recording metrics of %s failed", record.request_id)
        if record.route in PROBE_PATHS and record.status < 400:
            return  # probes every few seconds would drown the log
        fields = record.log_fields(e2e)
        access_log.info("%s %s %s %d tenant=%s outcome=%s prompt=%d completion=%d %.3fs", record.request_id,
                        record.method, record.route, record.status, record.tenant, fields["outcome"],
                        record.prompt_tokens, record.completion_tokens, e2e, extra=fields)
