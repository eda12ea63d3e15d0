"""GET /v1/models and /v1/models/{model}: the models this tenant may use, in OpenAI's shape.

Both answer from `ServedModels.listed` / `resolve` (gateway/served_models.py), which
ask gateway/tenancy/model_access.py's one access decision, as every generation and
tokenizer route does: a model the tenant may not use is listed nowhere and
answers exactly like one that does not exist (404 model_not_found). It knows
nothing about request bodies or generation.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import authenticate
from gateway.state import GatewayState, get_state
from gateway.tenancy.model_access import ServedModel
from shared.model_info import ModelInfo


def model_object(state: GatewayState, model: ServedModel) -> dict[str, Any]:
    obj: dict[str, Any] = {"id": model.id, "object": "model", "created": state.started_at, "owned_by": "pageserve",
                           "max_model_len": model.max_model_len or None}
    if model.parent is not None:
        obj["parent"] = model.parent  # a LoRA adapter: the base model it runs on
    return obj


def lora_name_for(info: ModelInfo, model: str) -> str:
    """The adapter a resolved model id names on the engine serving it ("" for a base model)."""
    return model if any(a.name == model for a in info.adapters) else ""


async def list_models(request: Request) -> Response:
    state = get_state(request)
    auth = await authenticate(request, state.store)
    models = state.models.listed(auth.models, state.engine)
    return JSONResponse({"object": "list", "data": [model_object(state, m) for m in models]})


async def get_model(request: Request) -> Response:
    state = get_state(request)
    auth = await authenticate(request, state.store)
    model = state.models.resolve(request.path_params["model"], auth.models, state.engine, auth.aliases)
    return JSONResponse(model_object(state, model))
