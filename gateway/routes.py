"""The HTTP endpoints: thin functions that authenticate, parse, tokenize and hand off.

    POST /v1/chat/completions   chat messages -> chat template -> tokens -> serving
    POST /v1/completions        prompt (text or token ids) -> tokens -> serving
    POST /v1/responses          OpenAI's Responses API over the chat path, stateless (responses_api.py)
    GET  /v1/models, /v1/models/{model}   the models this tenant may use (models_api.py)
    POST /tokenize, /detokenize vLLM's tokenizer endpoints (tokenize_api.py)
    GET  /openapi.json          the API document, generated from the request models (openapi.py)
    GET  /health                engine and Redis status (no key needed)

Every route with a key checks it before reading the body (`check_key_first`),
so an unauthenticated client never gets a body read, parsed, templated or
tokenized; the body's model goes through the one access decision and its
fallbacks (fallbacks.py), and the request is then admitted (key + quotas
again, one Redis round trip) by `serving.serve`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.auth import bearer_key, check_key_first
from gateway.body import read_json_object
from gateway.fallbacks import serve_model
from gateway.models_api import get_model, list_models
from gateway.openapi import openapi_json
from gateway.prompts import Prompts
from gateway.responses_api import responses
from gateway.schemas import parse_chat, parse_completion
from gateway.serving import PromptInput
from gateway.state import GatewayState, get_state
from gateway.tokenize_api import detokenize, tokenize


async def chat_completions(request: Request) -> ASGIApp:
    state = get_state(request)
    key = bearer_key(request)
    auth = await check_key_first(key, state.store, state.recent_keys)
    chat = parse_chat(await _read_body(request, state))

    async def prompt(prompts: Prompts) -> PromptInput:
        return PromptInput(await prompts.chat(chat.messages, chat.tools, template=chat.template), param="messages")

    return await serve_model(request, state, "chat", chat.settings, prompt, auth, key)


async def completions(request: Request) -> ASGIApp:
    state = get_state(request)
    key = bearer_key(request)
    auth = await check_key_first(key, state.store, state.recent_keys)
    completion = parse_completion(await _read_body(request, state))

    async def prompt(prompts: Prompts) -> PromptInput:
        return PromptInput(await prompts.completion(completion.prompt), param="prompt",
                           text=completion.prompt if isinstance(completion.prompt, str) else None)

    return await serve_model(request, state, "completion", completion.settings, prompt, auth, key)


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


async def _read_body(request: Request, state: GatewayState) -> dict[str, Any]:
    return await read_json_object(request, state.config.max_body_bytes, state.config.body_timeout_s)


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
