"""OpenAI request bodies: parsed and checked field by field, turned into typed requests.

Owns the shape of `/v1/chat/completions` and `/v1/completions` bodies and their
conversion to `SamplingParams` + stop strings. Every failure becomes an
`InvalidRequest` naming the offending `param`. It knows nothing about
tokenizers, the engine or tenants: limits that need the tokenizer or the model
(prompt length vs context) are checked by the handler.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest
from gateway.response_format import STRUCTURED_FIELDS, grammar_from_body
from gateway.tools import ToolPlan, plan_tools
from shared.sampling import SamplingError, SamplingParams
from shared.structured import GrammarSpec

INFORMATIONAL_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})
"""Accepted and ignored: they change nothing about the generated tokens."""

NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logprobs": (False,),
    "echo": (False,),
    "best_of": (1,),
}
"""Fields we do not implement but accept at their no-op value (SDKs send some by default)."""

MAX_STOP_STRINGS = 8
MAX_STOP_LENGTH = 256


class _Body(BaseModel):
    # strict: no "1" -> 1, no true -> 1; an int is still accepted where a float is expected.
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    # Structured outputs (gateway/response_format.py checks their insides and names the bad field).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant turn that called tools."""
    tool_call_id: str | None = None
    """A tool turn: the call it answers."""


class _ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    """Accepted; a forced call is one call, an auto one is what the model writes."""


class _CompletionBody(_Body):
    prompt: str | list[str] | list[int] = Field(min_length=1)


_B = TypeVar("_B", bound=_Body)


@dataclass(frozen=True)
class GenerationSettings:
    """What both endpoints share once validated."""

    model: str
    sampling: SamplingParams
    max_tokens_given: bool
    """False: the handler fills max_tokens from the room left in the context."""
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    max_param: str = "max_tokens"
    """The body field max_tokens came from ("max_tokens" or "max_completion_tokens"), for errors."""
    grammar: GrammarSpec | None = None
    """Structured output (response_format, guided_*, or a forced tool call) for the engine."""
    parse_tool_calls: bool = False
    """The request offered tools (tool_choice not "none"): the output's tool calls become tool_calls."""


@dataclass(frozen=True)
class ChatRequest:
    settings: GenerationSettings
    messages: list[dict[str, Any]]
    """[{"role", "content"}] with content flattened to text (plus tool_calls / tool_call_id where
    given), ready for the chat template."""
    tools: ToolPlan | None = None


@dataclass(frozen=True)
class CompletionRequest:
    settings: GenerationSettings
    prompt: str | list[int]
    """Text to tokenize, or token ids given directly."""


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    return body


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    parsed = _validate(_ChatBody, body)
    messages = [_chat_message(m, i) for i, m in enumerate(parsed.messages)]
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    param = "max_completion_tokens" if parsed.max_completion_tokens is not None else "max_tokens"
    settings = _settings(parsed, max_tokens, param)
    tools = plan_tools(parsed.tools, parsed.tool_choice)
    if tools is not None and tools.grammar is not None:
        if settings.grammar is not None:
            raise InvalidRequest("a forced tool call cannot be combined with a structured output format",
                                 param="tool_choice")
        settings = dataclasses.replace(settings, grammar=tools.grammar)
    if tools is not None and tools.parse_calls:
        settings = dataclasses.replace(settings, parse_tool_calls=True)
    return ChatRequest(settings, messages, tools)


def _chat_message(m: ChatMessage, i: int) -> dict[str, Any]:
    text = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
    if m.role == "tool" and not m.tool_call_id:
        raise InvalidRequest("a tool message needs the tool_call_id it answers", param=f"messages[{i}].tool_call_id")
    if text is None and not (m.role == "assistant" and m.tool_calls):
        raise InvalidRequest("the message needs content", param=f"messages[{i}].content")
    if m.tool_calls and m.role != "assistant":
        raise InvalidRequest("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
    message: dict[str, Any] = {"role": m.role, "content": text}
    if m.tool_calls:
        message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    return message


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    parsed = _validate(_CompletionBody, body)
    return CompletionRequest(_settings(parsed, parsed.max_tokens, "max_tokens"), _one_prompt(parsed.prompt))


def _one_prompt(prompt: str | list[str] | list[int]) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    texts = [p for p in prompt if isinstance(p, str)]
    if texts:
        if len(prompt) != 1:
            raise InvalidRequest("only one prompt per request is supported", param="prompt")
        return texts[0]
    ids = [p for p in prompt if isinstance(p, int)]
    if any(t < 0 for t in ids):
        raise InvalidRequest("prompt token ids must be non-negative", param="prompt")
    return ids


def _validate(model: type[_B], body: dict[str, Any]) -> _B:
    body = _drop_accepted_extras(body, model)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param_name(err["loc"])
        if err["type"] == "extra_forbidden":
            raise InvalidRequest(f"unsupported parameter: {param}", param=param, code="unsupported_parameter") from None
        if err["type"] == "missing":
            raise InvalidRequest(f"missing required parameter: {param}", param=param, code="missing_parameter") from None
        raise InvalidRequest(f"invalid value for {param}: {err['msg']}", param=param, code="invalid_value") from None


def _drop_accepted_extras(body: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    # Anything else left in is forbidden by the model: a 400 naming it.
    return {k: v for k, v in body.items() if k in model.model_fields or not _ignorable(k, v)}


def _ignorable(key: str, value: Any) -> bool:
    neutral = NEUTRAL_VALUES.get(key, ())
    return key in INFORMATIONAL_FIELDS or value is None or any(type(value) is type(v) and value == v for v in neutral)


_UNION_TAG = re.compile(r"[\[\]-]|^(str|int|float|bool|list|dict)$")


def _param_name(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'content', 'str') -> 'messages[0].content'; union branch tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_TAG.search(part):
            out += f".{part}" if out else part
    return out or "body"


def _settings(parsed: _Body, max_tokens: int | None, max_param: str) -> GenerationSettings:
    stop = _stop_strings(parsed.stop)
    if parsed.stream_options is not None and not parsed.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    fields: dict[str, Any] = {
        k: v
        for k, v in {
            "n": parsed.n,
            "temperature": parsed.temperature,
            "top_p": parsed.top_p,
            "top_k": parsed.top_k,
            "seed": parsed.seed,
            "min_tokens": parsed.min_tokens,
            "ignore_eos": parsed.ignore_eos,
        }.items()
        if v is not None
    }
    if parsed.stop_token_ids is not None:
        fields["stop_token_ids"] = tuple(parsed.stop_token_ids)
    # Until the handler knows the room left in the context, a large placeholder keeps
    # min_tokens validation honest; the handler replaces it.
    fields["max_tokens"] = max_tokens if max_tokens is not None else max(1, fields.get("min_tokens", 1))
    try:
        sampling = SamplingParams(**fields)
    except SamplingError as e:
        param = max_param if e.param == "max_tokens" else e.param
        raise InvalidRequest(str(e), param=param, code="invalid_value") from None
    grammar = grammar_from_body({name: getattr(parsed, name) for name in STRUCTURED_FIELDS})
    return GenerationSettings(
        grammar=grammar,
        model=parsed.model,
        sampling=sampling,
        max_tokens_given=max_tokens is not None,
        stop=stop,
        stream=bool(parsed.stream),
        include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
        max_param=max_param,
    )


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if len(items) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
    for s in items:
        if not s or len(s) > MAX_STOP_LENGTH:
            raise InvalidRequest(f"each stop string must have 1 to {MAX_STOP_LENGTH} characters", param="stop")
    return tuple(items)
