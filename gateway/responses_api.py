"""POST /v1/responses: OpenAI's Responses API over the chat path, stateless.

    Responses body ──to_chat_body──> chat body ──parse_chat──> prompt, sampling, grammar, tools
                                                               │ serving.plan / serve (admission,
                                                               │ quotas, accounting: chat's own)
    Response object / typed SSE events <──ResponsesShape───────┘

What maps to what: `input` (text, or message items with input_text/output_text parts, and
`function_call` / `function_call_output` items) becomes chat messages, `instructions` a system
message first; `max_output_tokens` is max_tokens; `text.format` (json_schema, json_object) goes
through the structured outputs; function `tools` and `tool_choice` through the chat tools and
their parser. Stateless: nothing is stored (`store` is accepted, the response says `store: false`);
`previous_response_id`, `conversation`, `background` and prompt templates are a 400 naming them.
A stream is OpenAI's typed events: response.created, response.in_progress, then per output item
output_item.added, content_part.added, output_text.delta..., output_text.done, content_part.done,
output_item.done (a function call: function_call_arguments.delta/done), then response.completed.
Knows nothing about the engine; errors name the Responses field, not the chat one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp

from gateway.auth import bearer_key, check_key_first
from gateway.body import read_json_object
from gateway.errors import APIError, InternalError, InvalidRequest
from gateway.fallbacks import serve_model
from gateway.generation import Generation
from gateway.prompts import Prompts
from gateway.request_fields import split_fields
from gateway.schemas import parse_chat
from gateway.serving import PromptInput
from gateway.sse import sse_event
from gateway.state import get_state
from gateway.tool_parser import ArgumentsDelta, Event, ToolCallParser, ToolCallStart

DECLARED = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "text",
            "tools", "tool_choice", "store", "previous_response_id", "conversation", "background", "prompt",
            "metadata", "parallel_tool_calls", "seed", "top_k", "stop"}
"""Fields read here; any other is accepted and ignored (its name logged), as on the other routes."""
_CHAT_PARAM = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}
"""A chat field named in an error -> the Responses field the client sent."""


async def responses(request: Request) -> ASGIApp:
    state = get_state(request)
    key = bearer_key(request)
    auth = await check_key_first(key, state.store, state.recent_keys)
    body = await read_json_object(request, state.config.max_body_bytes, state.config.body_timeout_s)
    chat_body = to_chat_body(split_fields(body, DECLARED, "responses"))
    try:
        chat = parse_chat(chat_body)
    except InvalidRequest as e:
        raise _renamed(e) from None

    async def prompt(prompts: Prompts) -> PromptInput:
        return PromptInput(await prompts.chat(chat.messages, chat.tools, template=chat.template), param="input")

    def shape(model: str) -> ResponsesShape:
        return ResponsesShape(model=model, request_body=body)

    return await serve_model(request, state, "chat", chat.settings, prompt, auth, key, shape)


def _renamed(e: InvalidRequest) -> InvalidRequest:
    param = e.param or ""
    head, dot, rest = param.partition(".")
    base, bracket, index = head.partition("[")
    if base in _CHAT_PARAM:
        param = _CHAT_PARAM[base] + bracket + index + dot + rest
    return InvalidRequest(e.message, param=param or None, code=e.code)


# ---------------------------------------------------------------------------- request


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses body as a chat completions body (validated again, strictly, by parse_chat)."""
    for name in ("previous_response_id", "conversation", "prompt"):
        if body.get(name) is not None:
            raise InvalidRequest(f"{name} is not supported: this server is stateless and stores no responses "
                                 "or conversations; send the whole conversation in input",
                                 param=name, code="unsupported_parameter")
    if body.get("background"):
        raise InvalidRequest("background responses are not supported", param="background",
                             code="unsupported_parameter")
    if "input" not in body:
        raise InvalidRequest("missing required parameter: input", param="input", code="missing_parameter")
    messages = _messages(body["input"])
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise InvalidRequest("instructions must be a string", param="instructions")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("seed", "seed"), ("top_k", "top_k"), ("stop", "stop"), ("stream", "stream")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("input must be a string or a non-empty list of items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest("each input item must be an object", param=f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _content(item.get("content"), i)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
        else:
            raise InvalidRequest(f"input items of type {str(kind)[:40]!r} are not supported (message, "
                                 "function_call and function_call_output are)", param=f"input[{i}].type")
    return out


def _content(content: Any, i: int) -> Any:
    """A message's content: a string, or input_text / output_text parts joined (other parts: a 400)."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise InvalidRequest("only text content parts are supported", param=f"input[{i}].content[{j}]")
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("a text part needs its text", param=f"input[{i}].content[{j}].text")
        texts.append(text)
    return "".join(texts)


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest("text.format.type must be text, json_object or json_schema", param="text.format.type")


def _tools(tools: Any) -> list[Any]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise InvalidRequest("only function tools are supported", param=f"tools[{i}].type")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if k in t}})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


# ---------------------------------------------------------------------------- response


@dataclass
class ResponsesShape:
    """One request's Response object and stream events (serving.Responder)."""

    model: str
    request_body: dict[str, Any]
    id_prefix: str = "resp_"
    created_at: int = field(default_factory=lambda: int(time.time()))
    _seq: int = 0

    def body(self, gen: Generation, request_id: str, text: str, finish_reason: str) -> dict[str, Any]:
        items = _items(_parsed(text, self._parses_tools(gen)))
        return self._response(request_id, gen, items, finish_reason)

    async def events(self, gen: Generation, request_id: str) -> AsyncIterator[bytes]:
        stream = _ItemStream(self)
        yield self._event("response.created", response=self._response(request_id, gen, [], None))
        yield self._event("response.in_progress", response=self._response(request_id, gen, [], None))
        parser = ToolCallParser() if self._parses_tools(gen) else None
        reason = "length"
        try:
            async for delta in gen.deltas():
                pieces: list[Event] = [delta.text] if parser is None else parser.feed(delta.text)
                if delta.finish_reason is not None:
                    reason = delta.finish_reason
                    pieces += parser.finish() if parser is not None else []
                for piece in pieces:
                    for event in stream.feed(piece):
                        yield event
        except APIError as e:
            yield self._event("error", code=e.code, message=e.message, param=e.param)
            return
        except Exception:
            gen.failed = True
            err = InternalError("internal error while streaming", code="internal_error")
            yield self._event("error", code=err.code, message=err.message, param=None)
            return
        for event in stream.close():
            yield event
        yield self._event("response.completed", response=self._response(request_id, gen, stream.items, reason))

    def _parses_tools(self, gen: Generation) -> bool:
        return bool(self.request_body.get("tools")) and self.request_body.get("tool_choice") != "none"

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\n" + sse_event(payload)

    def _response(self, request_id: str, gen: Generation, items: list[dict[str, Any]],
                  reason: str | None) -> dict[str, Any]:
        b = self.request_body
        u = gen.usage
        status = "in_progress" if reason is None else "incomplete" if reason == "length" else "completed"
        return {
            "id": request_id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": items, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
            "temperature": gen.sampling.temperature, "top_p": gen.sampling.top_p,
            "parallel_tool_calls": bool(b.get("parallel_tool_calls", True)),
            "tool_choice": b.get("tool_choice") or "auto", "tools": b.get("tools") or [],
            "text": b.get("text") or {"format": {"type": "text"}}, "store": False, "previous_response_id": None,
            "metadata": b.get("metadata") or {},
            "usage": None if reason is None else {
                "input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens,
            },
        }


def _parsed(text: str, tools: bool) -> list[Event]:
    if not tools:
        return [text]
    parser = ToolCallParser()
    return parser.feed(text) + parser.finish()


def _items(events: list[Event]) -> list[dict[str, Any]]:
    stream = _ItemStream(ResponsesShape("", {}))  # its events are not sent: only the items are kept
    for e in events:
        stream.feed(e)
    stream.close()
    return stream.items


class _ItemStream:
    """Parsed output (text, tool call starts, argument text) -> output items and their events."""

    def __init__(self, shape: ResponsesShape) -> None:
        self._shape = shape
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def feed(self, piece: Event) -> list[bytes]:
        if isinstance(piece, str):
            if not piece:
                return []
            out = [] if self._open is not None and self._open["type"] == "message" else self._start_message()
            self._open["content"][0]["text"] += piece  # type: ignore[index]
            return out + [self._ev("response.output_text.delta", content_index=0, delta=piece, logprobs=[])]
        if isinstance(piece, ToolCallStart):
            item = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "call_id": piece.id,
                    "name": piece.name, "arguments": "", "status": "in_progress"}
            return self.close() + self._start(item)
        assert isinstance(piece, ArgumentsDelta)
        assert self._open is not None and self._open["type"] == "function_call"
        self._open["arguments"] += piece.text
        return [self._ev("response.function_call_arguments.delta", delta=piece.text)]

    def _start_message(self) -> list[bytes]:
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        content: list[dict[str, Any]] = []
        item: dict[str, Any] = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant",
                                "status": "in_progress", "content": content}
        out = self.close() + self._start(item)
        content.append(part)  # after output_item.added, which announces the message with no part yet
        return out + [self._ev("response.content_part.added", content_index=0, part=dict(part))]

    def _start(self, item: dict[str, Any]) -> list[bytes]:
        self.items.append(item)
        self._open = item
        return [self._shape._event("response.output_item.added", output_index=len(self.items) - 1,
                                   item=dict(item))]

    def close(self) -> list[bytes]:
        """The open item is done (its done events); nothing open: nothing."""
        item, self._open = self._open, None
        if item is None:
            return []
        self._open = item  # _ev reads it
        if item["type"] == "message":
            part = item["content"][0]
            out = [self._ev("response.output_text.done", content_index=0, text=part["text"], logprobs=[]),
                   self._ev("response.content_part.done", content_index=0, part=part)]
        else:
            out = [self._ev("response.function_call_arguments.done", arguments=item["arguments"],
                            name=item["name"])]
        self._open = None
        item["status"] = "completed"
        return out + [self._shape._event("response.output_item.done", output_index=self.items.index(item),
                                         item=item)]

    def _ev(self, kind: str, **fields: Any) -> bytes:
        assert self._open is not None
        return self._shape._event(kind, item_id=self._open["id"], output_index=len(self.items) - 1, **fields)
