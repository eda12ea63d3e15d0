"""GET /openapi.json: the API's OpenAPI 3.1 document, generated from the pydantic models.

Request bodies come from the same models that validate them (`gateway/schemas.py`,
`gateway/tokenize_api.py`); responses from the models below, which describe
what `gateway/openai_format.py` and the routes build (the fuzz test in
tests/gateway/test_openapi_fuzz.py checks every response against them). Built
once per process. It knows nothing about how a request is served.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.schemas import _ChatBody, _CompletionBody
from gateway.tokenize_api import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length"]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


_ERROR_STATUSES = ("400", "401", "404", "413", "415", "429", "503")
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.model_json_schema()['title']}"}


def _operation(summary: str, body: Any, ok: dict[str, Any], *, auth: bool = True) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": {"description": "OK", "content": ok}}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if auth:
        op["security"] = [{"bearer": []}]
        op["responses"].update({s: {"description": "error", "content": {"application/json": {
            "schema": _ref(ErrorResponse)}}} for s in _ERROR_STATUSES})
    return op


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


@functools.cache
def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [
        _ChatBody, _CompletionBody, TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest,
        ErrorResponse, ChatCompletion, Completion, ModelCard, ModelList, TokenizeResponse, DetokenizeResponse,
    ]
    components: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[schema["title"]] = schema
    tokenize_body = {"oneOf": [_ref(TokenizeCompletionRequest), _ref(TokenizeChatRequest)]}
    model_param = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "pageserve", "version": "1", "description": "OpenAI-compatible API (see README)"},
        "paths": {
            "/v1/chat/completions": {"post": _operation(
                "Chat completion", _ref(_ChatBody), {**_json(ChatCompletion), **_SSE})},
            "/v1/completions": {"post": _operation(
                "Text completion", _ref(_CompletionBody), {**_json(Completion), **_SSE})},
            "/v1/models": {"get": _operation("The served model", None, _json(ModelList))},
            "/v1/models/{model}": {"get": {**_operation("One model", None, _json(ModelCard)),
                                           "parameters": [model_param]}},
            "/tokenize": {"post": _operation("Tokenize a prompt or chat", tokenize_body, _json(TokenizeResponse))},
            "/detokenize": {"post": _operation("Token ids to text", _ref(DetokenizeRequest),
                                               _json(DetokenizeResponse))},
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi_document())
