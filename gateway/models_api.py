"""GET /v1/models and /v1/models/{model}, and the one check every route makes of a body's `model`.

Owns the OpenAI model object and which names this gateway answers to (the engine's
model name and the spec it was started with). It knows nothing about request
bodies or generation.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import authenticate
from gateway.errors import NotFound
from gateway.state import GatewayState, get_state


def check_model(state: GatewayState, model: str) -> None:
    """A 404 naming `model` unless this server serves it (503 when the engine is down)."""
    info = state.engine_client().model_info
    if model not in state.served_model_names(info):
        raise NotFound(f"the model {model[:128]!r} does not exist; this server serves {info.model_name!r}",
                       param="model", code="model_not_found")


def _model_object(state: GatewayState) -> dict[str, Any]:
    info = state.engine_client().model_info
    return {"id": info.model_name, "object": "model", "created": state.started_at, "owned_by": "pageserve",
            "max_model_len": info.max_model_len}


async def list_models(request: Request) -> Response:
    state = get_state(request)
    await authenticate(request, state.store)
    return JSONResponse({"object": "list", "data": [_model_object(state)]})


async def get_model(request: Request) -> Response:
    state = get_state(request)
    await authenticate(request, state.store)
    check_model(state, request.path_params["model"])
    return JSONResponse(_model_object(state))
