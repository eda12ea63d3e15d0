"""POST /tokenize and /detokenize in vLLM's request and response shapes.

    /tokenize    {"prompt": str} or {"messages": [...]} (chat template applied)
                 -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize  {"tokens": [int]} -> {"prompt": str}

Both need a valid key, checked before the body is read (tokenizing is work an
unauthenticated client must not cause). `model` (default: the gateway's first
`--model`) goes through the one access decision (`ServedModels.resolve`), and
picks that model's tokenizer. Owns these request models (also in
/openapi.json); the tokenizer itself is `gateway/prompts.py`'s.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import bearer_key, check_key_first
from gateway.body import read_json_object
from gateway.prompts import Prompts
from gateway.request_fields import split_fields
from gateway.schemas import ChatMessage, TokenId, flatten_messages
from gateway.state import GatewayState, get_state
from gateway.tenancy.store import AuthContext
from gateway.validation_errors import invalid_request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"additionalProperties": True})


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool | None = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[TokenId]


_M = TypeVar("_M", bound=BaseModel)


async def tokenize(request: Request) -> Response:
    state, auth, body = await _authorized_body(request)
    if "messages" in body:
        chat = _validate(TokenizeChatRequest, body)
        prompts, max_model_len = _model(state, auth, chat.model)
        tokens = await prompts.chat(flatten_messages(chat.messages), None, chat.add_generation_prompt,
                                    chat.add_special_tokens)
        want_strs = chat.return_token_strs
    else:
        text = _validate(TokenizeCompletionRequest, body)
        prompts, max_model_len = _model(state, auth, text.model)
        tokens = await prompts.text(text.prompt, text.add_special_tokens)
        want_strs = text.return_token_strs
    return JSONResponse({
        "count": len(tokens),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": prompts.token_strings(tokens) if want_strs else None,
    })


async def detokenize(request: Request) -> Response:
    state, auth, body = await _authorized_body(request)
    parsed = _validate(DetokenizeRequest, body)
    prompts, _ = _model(state, auth, parsed.model)
    prompts.check_vocab(parsed.tokens, "tokens")
    return JSONResponse({"prompt": await prompts.detokenize(parsed.tokens)})


async def _authorized_body(request: Request) -> tuple[GatewayState, AuthContext, dict[str, Any]]:
    state = get_state(request)
    auth = await check_key_first(bearer_key(request), state.store, state.recent_keys)
    body = await read_json_object(request, state.config.max_body_bytes, state.config.body_timeout_s)
    return state, auth, body


def _model(state: GatewayState, auth: AuthContext, requested: str | None) -> tuple[Prompts, int]:
    """The named model's (default: the first --model's) tokenizer and context, as this tenant may use it."""
    model = state.models.resolve(requested or state.config.model, auth.models, state.engine, auth.aliases)
    state.models.require_live(model)
    return state.models.prompts_for(model), state.models.engine_for(model.id, state.engine).model_info.max_model_len


def _validate(model: type[_M], body: dict[str, Any]) -> _M:
    try:
        return model.model_validate(split_fields(body, set(model.model_fields), "tokenize"))
    except ValidationError as e:
        raise invalid_request(e) from None

