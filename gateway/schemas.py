"""OpenAI request bodies: parsed and checked field by field, turned into typed requests.

Owns the shape of `/v1/chat/completions` and `/v1/completions` bodies and their
conversion to `SamplingParams` + stop strings. Every failure becomes an
`InvalidRequest` naming the offending `param`. It knows nothing about
tokenizers, the engine or tenants: limits that need the tokenizer or the model
(prompt length vs context) are checked by the handler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest
from shared.sampling import MAX_LOGPROBS, SamplingError, SamplingParams

INFORMATIONAL_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})
"""Accepted and ignored: they change nothing about the generated tokens."""

NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
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
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, as JSON keys are) -> bias in [-100, 100]."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class _ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class _CompletionBody(_Body):
    prompt: str | list[str] | list[int] = Field(min_length=1)
    logprobs: int | None = None
    """How many alternatives per token (0-20); the sampled token's logprob comes with any value."""


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
    given: frozenset[str] = frozenset()
    """The SamplingParams fields the body set: the engine's announced defaults fill only the others."""


@dataclass(frozen=True)
class ChatRequest:
    settings: GenerationSettings
    messages: list[dict[str, str]]
    """[{"role", "content"}] with content flattened to text, ready for the chat template."""


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
    messages = [
        {"role": m.role, "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
        for m in parsed.messages
    ]
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    param = "max_completion_tokens" if parsed.max_completion_tokens is not None else "max_tokens"
    return ChatRequest(_settings(parsed, max_tokens, param, _chat_logprobs(parsed)), messages)


def _chat_logprobs(parsed: _ChatBody) -> int | None:
    """Chat's pair (logprobs: bool, top_logprobs: int) as the number of alternatives, or None."""
    if parsed.top_logprobs is not None:
        if not parsed.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= parsed.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", param="top_logprobs",
                                 code="invalid_value")
    return (parsed.top_logprobs or 0) if parsed.logprobs else None


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    parsed = _validate(_CompletionBody, body)
    settings = _settings(parsed, parsed.max_tokens, "max_tokens", parsed.logprobs)
    return CompletionRequest(settings, _one_prompt(parsed.prompt))


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


def _settings(parsed: _Body, max_tokens: int | None, max_param: str, logprobs: int | None) -> GenerationSettings:
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
            "presence_penalty": parsed.presence_penalty,
            "frequency_penalty": parsed.frequency_penalty,
            "repetition_penalty": parsed.repetition_penalty,
            "min_p": parsed.min_p,
            "logprobs": logprobs,
        }.items()
        if v is not None
    }
    if parsed.stop_token_ids is not None:
        fields["stop_token_ids"] = tuple(parsed.stop_token_ids)
    if parsed.logit_bias is not None:
        fields["logit_bias"] = _logit_bias(parsed.logit_bias)
    given = frozenset(fields)
    # Until the handler knows the room left in the context, a large placeholder keeps
    # min_tokens validation honest; the handler replaces it.
    fields["max_tokens"] = max_tokens if max_tokens is not None else max(1, fields.get("min_tokens", 1))
    try:
        sampling = SamplingParams(**fields)
    except SamplingError as e:
        param = max_param if e.param == "max_tokens" else e.param
        raise InvalidRequest(str(e), param=param, code="invalid_value") from None
    return GenerationSettings(
        model=parsed.model,
        sampling=sampling,
        max_tokens_given=max_tokens is not None,
        stop=stop,
        stream=bool(parsed.stream),
        include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
        max_param=max_param,
        given=given,
    )


def _logit_bias(bias: dict[str, float]) -> tuple[tuple[int, float], ...]:
    try:
        return tuple((int(token_id), value) for token_id, value in bias.items())
    except ValueError:
        raise InvalidRequest("logit_bias keys must be token ids (integers as strings)", param="logit_bias",
                             code="invalid_value") from None


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
