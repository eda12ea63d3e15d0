"""POST /tokenize and /detokenize in vLLM's request and response shapes.

    /tokenize    {"prompt": str} or {"messages": [...]} (chat template applied)
                 -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize  {"tokens": [int]} -> {"prompt": str}

Both need a valid key, checked before the body is read (tokenizing is work an
unauthenticated client must not cause). Owns these request models (also in
/openapi.json); the tokenizer itself is `gateway/prompts.py`'s.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import bearer_key, check_key_first
from gateway.body import read_json_object
from gateway.models_api import check_model
from gateway.request_fields import split_fields
from gateway.schemas import ChatMessage, TokenId, flatten_messages
from gateway.state import GatewayState, get_state
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
    state, body = await _authorized_body(request)
    if "messages" in body:
        chat = _validate(TokenizeChatRequest, body)
        _check_model(state, chat.model)
        tokens = await state.prompts.chat(flatten_messages(chat.messages), None, chat.add_generation_prompt,
                                          chat.add_special_tokens)
        want_strs = chat.return_token_strs
    else:
        text = _validate(TokenizeCompletionRequest, body)
        _check_model(state, text.model)
        tokens = await state.prompts.text(text.prompt, text.add_special_tokens)
        want_strs = text.return_token_strs
    return JSONResponse({
        "count": len(tokens),
        "max_model_len": state.engine_client().model_info.max_model_len,
        "tokens": tokens,
        "token_strs": state.prompts.token_strings(tokens) if want_strs else None,
    })


async def detokenize(request: Request) -> Response:
    state, body = await _authorized_body(request)
    parsed = _validate(DetokenizeRequest, body)
    _check_model(state, parsed.model)
    state.prompts.check_vocab(parsed.tokens, "tokens")
    return JSONResponse({"prompt": await state.prompts.detokenize(parsed.tokens)})


async def _authorized_body(request: Request) -> tuple[GatewayState, dict[str, Any]]:
    state = get_state(request)
    await check_key_first(bearer_key(request), state.store, state.recent_keys)
    return state, await read_json_object(request, state.config.max_body_bytes, state.config.body_timeout_s)


def _check_model(state: GatewayState, model: str | None) -> None:
    if model is not None:
        check_model(state, model)


def _validate(model: type[_M], body: dict[str, Any]) -> _M:
    try:
        return model.model_validate(split_fields(body, set(model.model_fields), "tokenize"))
    except ValidationError as e:
        raise invalid_request(e) from None

