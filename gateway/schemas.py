"""OpenAI request bodies: parsed and checked field by field, turned into typed requests.

Owns the shape of `/v1/chat/completions` and `/v1/completions` bodies and their
conversion to the sampling fields the body set + stop strings (the one `SamplingParams`
is built by gateway/sampling_plan.py, once max_tokens is known). Every failure becomes an
`InvalidRequest` naming the offending `param`. Which top-level fields are
honoured, refused or ignored is `gateway/request_fields.py`'s table; integers
are bounded here to what the wire and the sampler hold (int32 counts and ids,
int64 seeds), so nothing out of range reaches the msgpack encoder; the ranges
that are a sampling rule (n, temperature, top_p...) are `SamplingParams`', applied when it is built.
The request models are also the source of `/openapi.json` (gateway/openapi.py).
It knows nothing about tokenizers, the engine or tenants: limits that need the
tokenizer or the model (prompt length vs context, vocabulary) are checked by the handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest
from gateway.output_options import OutputOptions, TemplateOptions, allowed_ids
from gateway.request_fields import split_fields
from gateway.response_format import STRUCTURED_FIELDS, grammar_from_body
from gateway.tools import ToolPlan, plan_tools
from gateway.validation_errors import invalid_request
from shared.sampling import MAX_LOGPROBS
from shared.structured import GrammarSpec

MAX_STOP_STRINGS = 8
MAX_STOP_LENGTH = 256

INT32_MAX = 2**31 - 1
"""Counts and token ids: what the engine's int32/int64 tensors and msgpack hold with room to spare."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Seeds (vLLM's range): seed + sample index stays inside torch.Generator.manual_seed and msgpack's uint64."""



def _whole_number(value: Any) -> Any:
    """5.0 -> 5: JSON Schema counts a whole-number float as an integer (so clients and the OpenAPI
    document do; schemathesis sent `"top_k": -1.0`). 5.5, "5" and true still fail strict validation."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**64:
        return int(value)
    return value


WHOLE = BeforeValidator(_whole_number)
"""On every integer field of a body, after its bounds (so the OpenAPI document keeps them): strict, except
that a whole-number float is that integer."""
Int = Annotated[int, WHOLE]
Count = Annotated[int, Field(ge=0, le=INT32_MAX), WHOLE]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), WHOLE]


class _Body(BaseModel):
    # strict: no "1" -> 1, no true -> 1; an int is still accepted where a float is expected.
    # Unknown top-level fields never reach the model (request_fields.split_fields); nested ones are a 400.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": True})

    model: str
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX), WHOLE] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX), WHOLE] | None = None
    """-1 or 0 disables top-k (vLLM accepts both)."""
    n: Annotated[int, Field(ge=1, le=INT32_MAX), WHOLE] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), WHOLE] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    min_tokens: Count | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, as JSON keys are) -> bias in [-100, 100]."""
    best_of: Annotated[int, Field(ge=1, le=INT32_MAX), WHOLE] | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    # Structured outputs (gateway/response_format.py checks their insides and names the bad field).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's output options (gateway/output_options.py says where each acts).
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX), WHOLE] | None = None
    return_token_ids: bool | None = None
    prompt_logprobs: Int | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    """vLLM's extension: with include_usage, every chunk carries the usage so far."""


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
    model_config = ConfigDict(title="ChatCompletionRequest")

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT32_MAX), WHOLE] | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    """Accepted; a forced call is one call, an auto one is what the model writes."""
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class _CompletionBody(_Body):
    model_config = ConfigDict(title="CompletionRequest")

    prompt: str | list[str] | list[TokenId] = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX), WHOLE] | None = None
    """0 only with echo: the prompt alone (its logprobs with logprobs)."""
    logprobs: Int | None = None
    """How many alternatives per token (0-20); the sampled token's logprob comes with any value."""
    echo: bool | None = None


_B = TypeVar("_B", bound=_Body)


@dataclass(frozen=True)
class GenerationSettings:
    """What both endpoints share once validated."""

    model: str
    sampling_fields: Mapping[str, Any]
    """The SamplingParams fields the body set, checked by type and wire range only (max_tokens apart):
    gateway/sampling_plan.py builds the one SamplingParams from them, max_tokens and the engine's
    defaults for the fields left out, and applies the sampling rules there."""
    max_tokens: int | None
    """The body's max_tokens (or max_completion_tokens); None: decided from the room left in the context."""
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    """With include_usage: the usage so far in every chunk (stream_options.continuous_usage_stats)."""
    max_param: str = "max_tokens"
    """The body field max_tokens came from ("max_tokens" or "max_completion_tokens"), for errors."""
    grammar: GrammarSpec | None = None
    """Structured output (response_format, guided_*, or a forced tool call) for the engine."""
    parse_tool_calls: bool = False
    """The request offered tools (tool_choice not "none"): the output's tool calls become tool_calls."""
    output: OutputOptions = OutputOptions()
    """vLLM's options on the prompt and the text (gateway/output_options.py)."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        ids: tuple[int, ...] = self.sampling_fields.get("stop_token_ids", ())
        return ids


@dataclass(frozen=True)
class ChatRequest:
    settings: GenerationSettings
    messages: list[dict[str, Any]]
    """[{"role", "content"}] with content flattened to text (plus tool_calls / tool_call_id where
    given), ready for the chat template."""
    tools: ToolPlan | None = None
    template: TemplateOptions = TemplateOptions()


@dataclass(frozen=True)
class CompletionRequest:
    settings: GenerationSettings
    prompt: str | list[int]
    """Text to tokenize, or token ids given directly."""


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    parsed = _validate(_ChatBody, body, "chat")
    messages = flatten_messages(parsed.messages)
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    param = "max_completion_tokens" if parsed.max_completion_tokens is not None else "max_tokens"
    settings = _settings(parsed, max_tokens, param, _chat_logprobs(parsed))
    tools = plan_tools(parsed.tools, parsed.tool_choice)
    if tools is not None and tools.grammar is not None:
        if settings.grammar is not None:
            raise InvalidRequest("a forced tool call cannot be combined with a structured output format",
                                 param="tool_choice")
        settings = dataclasses.replace(settings, grammar=tools.grammar)
    if tools is not None and tools.parse_calls:
        settings = dataclasses.replace(settings, parse_tool_calls=True)
    return ChatRequest(settings, messages, tools, TemplateOptions.of(
        parsed.add_generation_prompt, parsed.continue_final_message, parsed.chat_template_kwargs, messages))


def _chat_logprobs(parsed: _ChatBody) -> int | None:
    """Chat's pair (logprobs: bool, top_logprobs: int) as the number of alternatives, or None."""
    if parsed.top_logprobs is not None:
        if not parsed.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= parsed.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", param="top_logprobs",
                                 code="invalid_value")
    return (parsed.top_logprobs or 0) if parsed.logprobs else None


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
    parsed = _validate(_CompletionBody, body, "completion")
    prompt_only = parsed.max_tokens == 0
    if prompt_only and not parsed.echo:
        raise InvalidRequest("max_tokens 0 needs echo (the prompt's text and logprobs alone)", param="max_tokens")
    if parsed.echo and parsed.logprobs is not None and parsed.prompt_logprobs is None:
        parsed = parsed.model_copy(update={"prompt_logprobs": parsed.logprobs})  # the echoed prompt's logprobs
    # max_tokens 0: the engine samples one token (it has no prompt-only request), which the gateway drops.
    settings = _settings(parsed, 1 if prompt_only else parsed.max_tokens, "max_tokens", parsed.logprobs)
    output = dataclasses.replace(settings.output, echo=bool(parsed.echo), prompt_only=prompt_only)
    return CompletionRequest(dataclasses.replace(settings, output=output), _one_prompt(parsed.prompt))


def _one_prompt(prompt: str | list[str] | list[int]) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    texts = [p for p in prompt if isinstance(p, str)]
    if texts:
        if len(prompt) != 1:
            raise InvalidRequest("only one prompt per request is supported", param="prompt")
        return texts[0]
    return [p for p in prompt if isinstance(p, int)]


def flatten_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them (list content joined to text, tool calls kept), checked
    the same way for /tokenize as for a chat completion."""
    return [_chat_message(m, i) for i, m in enumerate(messages)]


def _validate(model: type[_B], body: dict[str, Any], endpoint: str) -> _B:
    body = split_fields(body, set(model.model_fields), endpoint)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise invalid_request(e) from None


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
            "top_k": 0 if parsed.top_k == -1 else parsed.top_k,
            "seed": parsed.seed,
            "min_tokens": parsed.min_tokens,
            "ignore_eos": parsed.ignore_eos,
            "presence_penalty": parsed.presence_penalty,
            "frequency_penalty": parsed.frequency_penalty,
            "repetition_penalty": parsed.repetition_penalty,
            "min_p": parsed.min_p,
            "logprobs": logprobs,
            "prompt_logprobs": parsed.prompt_logprobs,
            "best_of": parsed.best_of,
            "use_beam_search": parsed.use_beam_search,
            "length_penalty": parsed.length_penalty,
            "early_stopping": parsed.early_stopping,
        }.items()
        if v is not None
    }
    if parsed.use_beam_search and parsed.temperature is None:
        fields["temperature"] = 0.0  # beam search is greedy; only an explicit temperature > 0 is refused
    if parsed.stop_token_ids is not None:
        fields["stop_token_ids"] = tuple(parsed.stop_token_ids)
    if parsed.logit_bias is not None:
        fields["logit_bias"] = _logit_bias(parsed.logit_bias)
    if parsed.allowed_token_ids is not None:
        fields["allowed_token_ids"] = allowed_ids(parsed.allowed_token_ids)
    grammar = grammar_from_body({name: getattr(parsed, name) for name in STRUCTURED_FIELDS})
    return GenerationSettings(
        grammar=grammar,
        model=parsed.model,
        sampling_fields=MappingProxyType(fields),
        max_tokens=max_tokens,
        stop=stop,
        stream=bool(parsed.stream),
        include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
        continuous_usage=bool(parsed.stream_options and parsed.stream_options.include_usage
                              and parsed.stream_options.continuous_usage_stats),
        max_param=max_param,
        output=OutputOptions(
            include_stop_str=bool(parsed.include_stop_str_in_output),
            skip_special_tokens=parsed.skip_special_tokens is not False,
            return_token_ids=bool(parsed.return_token_ids),
            bad_words=tuple(parsed.bad_words or ()),
            truncate_prompt_tokens=parsed.truncate_prompt_tokens,
        ),
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
