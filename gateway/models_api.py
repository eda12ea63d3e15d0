"""GET /v1/models and /v1/models/{model}, and the one check every route makes of a body's `model`.

Owns the OpenAI model object and which names this gateway answers to (the engine's
model name, the spec it was started with, and the LoRA adapters the engine announces, each
listed with `parent` set to the base model, as vLLM does). Which tenant may use which model or
adapter is not decided here (the one model-access decision of gateway/tenancy/). It knows nothing
about request bodies or generation.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import authenticate
from gateway.errors import NotFound
from gateway.state import GatewayState, get_state
from shared.model_info import ModelInfo


def check_model(state: GatewayState, model: str) -> None:
    """A 404 naming `model` unless this server serves it (503 when the engine is down)."""
    info = state.engine_client().model_info
    if model not in state.served_model_names(info) and lora_name_for(info, model) == "":
        raise NotFound(f"the model {model[:128]!r} does not exist; this server serves {info.model_name!r}",
                       param="model", code="model_not_found")


def lora_name_for(info: ModelInfo, model: str) -> str:
    """The adapter a body's `model` names ("" for the base model or an unknown name)."""
    return model if any(a.name == model for a in info.adapters) else ""


def _adapter_objects(state: GatewayState) -> list[dict[str, Any]]:
    info = state.engine_client().model_info
    return [{"id": a.name, "object": "model", "created": state.started_at, "owned_by": "pageserve",
             "parent": a.parent, "max_model_len": info.max_model_len} for a in info.adapters]


def _model_object(state: GatewayState) -> dict[str, Any]:
    info = state.engine_client().model_info
    return {"id": info.model_name, "object": "model", "created": state.started_at, "owned_by": "pageserve",
            "max_model_len": info.max_model_len}


async def list_models(request: Request) -> Response:
    state = get_state(request)
    await authenticate(request, state.store)
    return JSONResponse({"object": "list", "data": [_model_object(state), *_adapter_objects(state)]})


async def get_model(request: Request) -> Response:
    state = get_state(request)
    await authenticate(request, state.store)
    model = request.path_params["model"]
    check_model(state, model)
    adapter = [o for o in _adapter_objects(state) if o["id"] == model]
    return JSONResponse(adapter[0] if adapter else _model_object(state))
