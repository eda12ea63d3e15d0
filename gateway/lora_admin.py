"""LoRA adapters loaded and unloaded at run time, by the admin only (issue 43; vLLM's routes and shapes).

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/srv/adapters/sql", "base_model"?: "smollm2"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql", "base_model"?: "smollm2"}
      -> 200 {"object": "lora_adapter", "lora_name", "base_model", "status": "loaded" | "unloaded", "engines": N}

The admin token is checked before the body is read, exactly as for /admin (admin_routes.py): a tenant
key is a 401 `invalid_admin_token`, and with no token configured the routes are 404. Only the admin
names a folder; a tenant's request names an adapter, never a path (vLLM's docs warn about the other way).

A load goes to every live engine serving the base model (each replica, gateway/replicas/), all at once;
each answers once the adapter serves (the engine reads it off its step loop), after telling every
gateway its new adapters (ModelUpdate), so /v1/models lists it when this answers. `base_model` may be
left out while the engines serve one base. An unload goes to the engines that announce the adapter.
A reload under the same name is a new load (never a stale prefix-cache block). Engine refusals keep their
words: a bad adapter (rank, target module, shapes, missing file) is a 400 with param "lora_path", an
unknown adapter a 404 `model_not_found`; with several engines the message names the engine. Which tenant
may use the adapter is the tenant's model list (`pageserve admin tenant models`), as for any model.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin_routes import admin_refusal
from gateway.engine_client import EngineClient, EngineError
from gateway.errors import APIError, EngineUnavailable, InternalError, InvalidRequest, NotFound
from gateway.replicas.router import announced_adapters
from shared.protocol import MODEL_NOT_FOUND, REQUEST_FAILED, AdapterReply

log = logging.getLogger("pageserve.gateway")
MAX_BODY_BYTES = 64 << 10


def _engines(source: Any) -> list[EngineClient]:
    """Every live engine client behind the gateway: the replica set's, or the single link's one."""
    if hasattr(source, "live"):
        return [r.client for r in source.live()]
    client = source.client
    return [] if client is None else [client]


async def _fields(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidRequest("the body is too large", code="invalid_json")
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise InvalidRequest("the body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object", code="invalid_json")
    found: dict[str, str] = {}
    for name in (*names, "base_model"):
        value = data.get(name)
        if value is None and name == "base_model":
            continue
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(f"{name!r} is required (a non-empty string)", param=name, code="missing_field")
        found[name] = value.strip()
    return found


def _of_base(engines: list[EngineClient], base: str | None) -> tuple[str, list[EngineClient]]:
    """The base model and its engines; a 400 when there are several bases and none was named."""
    if not engines:
        raise EngineUnavailable("no engine is reachable; retry shortly", code="engine_unavailable")
    bases = sorted({e.model_info.model_name for e in engines})
    if base is None:
        if len(bases) > 1:
            raise InvalidRequest(f"the engines serve several base models ({', '.join(bases)}): name one in "
                                 "'base_model'", param="base_model", code="invalid_value")
        base = bases[0]
    chosen = [e for e in engines if e.model_info.model_name == base]
    if not chosen:
        raise InvalidRequest(f"no live engine serves the base model {base!r}", param="base_model",
                             code="invalid_value")
    return base, chosen


def _refusal(replies: list[tuple[EngineClient, AdapterReply | BaseException]], several: bool) -> APIError | None:
    """The first failure among the engines' answers, as the HTTP error it is; None when all succeeded."""
    for engine, reply in replies:
        where = f"engine {engine.address}: " if several else ""
        if isinstance(reply, TimeoutError):
            return EngineUnavailable(f"{where}no answer in time", code="engine_unavailable")
        if isinstance(reply, EngineError):
            return EngineUnavailable(f"{where}{reply}", code="engine_unavailable")
        if isinstance(reply, BaseException):
            raise reply
        if not reply.error:
            continue
        if reply.code == MODEL_NOT_FOUND:
            return NotFound(where + reply.error, param="lora_name", code="model_not_found")
        if reply.code == REQUEST_FAILED:
            return InternalError(where + reply.error, code="lora_load_failed")
        return InvalidRequest(where + reply.error, param="lora_path", code="invalid_lora_adapter")
    return None


async def _each(engines: list[EngineClient], call: Any) -> list[tuple[EngineClient, AdapterReply | BaseException]]:
    replies = await asyncio.gather(*(call(e) for e in engines), return_exceptions=True)
    return list(zip(engines, replies, strict=True))


def _done(name: str, base: str, status: str, engines: int) -> JSONResponse:
    return JSONResponse({"object": "lora_adapter", "lora_name": name, "base_model": base, "status": status,
                         "engines": engines})


async def load_lora_adapter(request: Request, admin_token: str | None) -> Response:
    if (refusal := admin_refusal(request, admin_token)) is not None:
        return refusal
    from gateway.state import get_state

    fields = await _fields(request, ("lora_name", "lora_path"))
    name, path = fields["lora_name"], fields["lora_path"]
    base, engines = _of_base(_engines(get_state(request).engine), fields.get("base_model"))
    replies = await _each(engines, lambda e: e.load_adapter(name, path))
    if (error := _refusal(replies, len(engines) > 1)) is not None:
        raise error
    log.info("admin loaded LoRA adapter %s on %d engine(s) of %s", name, len(engines), base)
    return _done(name, base, "loaded", len(engines))


async def unload_lora_adapter(request: Request, admin_token: str | None) -> Response:
    if (refusal := admin_refusal(request, admin_token)) is not None:
        return refusal
    from gateway.state import get_state

    fields = await _fields(request, ("lora_name",))
    name = fields["lora_name"]
    base, engines = _of_base(_engines(get_state(request).engine), fields.get("base_model"))
    holding = [e for e in engines if any(a == name for a, _ in announced_adapters(e.model_info))]
    if not holding:
        raise NotFound(f"the adapter {name!r} is not loaded", param="lora_name", code="model_not_found")
    replies = await _each(holding, lambda e: e.unload_adapter(name))
    if (error := _refusal(replies, len(holding) > 1)) is not None:
        raise error
    log.info("admin unloaded LoRA adapter %s from %d engine(s) of %s", name, len(holding), base)
    return _done(name, base, "unloaded", len(holding))


def lora_admin_routes(admin_token: str | None) -> list[Route]:
    async def load(request: Request) -> Response:
        return await load_lora_adapter(request, admin_token)

    async def unload(request: Request) -> Response:
        return await unload_lora_adapter(request, admin_token)

    return [Route("/v1/load_lora_adapter", load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload, methods=["POST"])]
