"""The HTTP endpoints: thin functions that authenticate, parse, tokenize and hand off.

    POST /v1/chat/completions   chat messages -> chat template -> tokens -> serving
    POST /v1/completions        prompt (text or token ids) -> tokens -> serving
    GET  /v1/models             the one model the engine serves
    GET  /health                engine and Redis status (no key needed)

A generation request's key is verified by its admission script, one Redis round
trip for key and quotas (`gateway/auth.py`); a bad key still gets its 401 before
any other refusal, and a large body is never read for one.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.auth import authenticate, bearer_key, key_checked_first
from gateway.errors import APIError, NotFound
from gateway.schemas import GenerationSettings, parse_chat, parse_completion, parse_json
from gateway.serving import PromptInput, plan, serve
from gateway.state import GatewayState, get_state


async def chat_completions(request: Request) -> ASGIApp:
    state = get_state(request)
    key = bearer_key(request)
    async with key_checked_first(request, key, state.store):
        chat = parse_chat(parse_json(await read_body(request, state.config.max_body_bytes)))
        _check_model(state, chat.settings)
        prompt = PromptInput(await state.prompts.chat(chat.messages, chat.tools), param="messages")
        checked = plan(state, "chat", chat.settings, prompt)
    return await serve(request, state, checked, key)


async def completions(request: Request) -> ASGIApp:
    state = get_state(request)
    key = bearer_key(request)
    async with key_checked_first(request, key, state.store):
        completion = parse_completion(parse_json(await read_body(request, state.config.max_body_bytes)))
        _check_model(state, completion.settings)
        prompt = PromptInput(await state.prompts.completion(completion.prompt), param="prompt")
        checked = plan(state, "completion", completion.settings, prompt)
    return await serve(request, state, checked, key)


async def models(request: Request) -> Response:
    state = get_state(request)
    await authenticate(request, state.store)
    info = state.engine_client().model_info
    created = int(time.time())
    return JSONResponse({
        "object": "list",
        "data": [{"id": info.model_name, "object": "model", "created": created, "owned_by": "pageserve",
                  "max_model_len": info.max_model_len}],
    })


async def health(request: Request) -> Response:
    state = get_state(request)
    client = state.engine.client
    redis_ok = await state.redis.ping()
    engine = {"healthy": client is not None}
    if client is not None:
        engine["model"] = client.model_info.model_name  # type: ignore[assignment]
    ok = client is not None and redis_ok
    body = {"status": "ok" if ok else "unavailable", "engine": engine, "redis": {"healthy": redis_ok}}
    return JSONResponse(body, status_code=200 if ok else 503)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it passes `limit` bytes (never buffered whole first)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> APIError:
    return APIError(f"request body exceeds {limit} bytes", code="request_too_large", status_code=413)


def _check_model(state: GatewayState, settings: GenerationSettings) -> None:
    info = state.engine_client().model_info
    if settings.model not in state.served_model_names(info):
        raise NotFound(f"the model {settings.model!r} does not exist; this server serves {info.model_name!r}",
                       param="model", code="model_not_found")


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
