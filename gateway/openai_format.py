"""OpenAI's JSON shapes for responses and stream chunks, built from plain values.

Owns the exact field layout of `chat.completion`, `chat.completion.chunk`,
`text_completion` (also its stream chunks) and `usage`. One `ResponseFormat`
per request keeps `id`, `created` and `model` constant across every chunk.
It knows nothing about the engine, tokenizers or HTTP.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.generation import Usage
from gateway.logprobs import LogprobEntry, token_bytes
from gateway.tool_parser import ArgumentsDelta, Event, ToolCallStart

Endpoint = Literal["chat", "completion"]


def id_prefix(endpoint: Endpoint) -> str:
    return "chatcmpl-" if endpoint == "chat" else "cmpl-"


def new_request_id(endpoint: Endpoint) -> str:
    return id_prefix(endpoint) + uuid.uuid4().hex


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass(frozen=True)
class ResponseFormat:
    endpoint: Endpoint
    request_id: str
    model: str
    include_usage: bool = False
    """Streaming only: every chunk carries "usage": null and a last chunk carries the usage."""
    continuous_usage: bool = False
    """Streaming with include_usage: every chunk carries the usage so far instead of null (vLLM's
    stream_options.continuous_usage_stats)."""
    created: int = field(default_factory=lambda: int(time.time()))

    # ------------------------------------------------------------------ streaming

    def role_chunk(self, index: int, usage: Usage | None = None) -> dict[str, Any]:
        """The first chunk of a chat choice announces the role; it goes out with the choice's first token."""
        assert self.endpoint == "chat"
        return self._chunk([self._choice(index, {"role": "assistant", "content": ""}, None)], usage)

    def text_chunk(self, index: int, text: str, usage: Usage | None = None,
                   logprobs: list[LogprobEntry] | None = None) -> dict[str, Any]:
        """A text delta; `logprobs` (when the request asked) are the tokens it consumed."""
        content = {"content": text} if self.endpoint == "chat" else text
        chunk = self._chunk([self._choice(index, content, None)], usage)
        if logprobs:
            chunk["choices"][0]["logprobs"] = self.logprobs_body(logprobs)
        return chunk

    def logprobs_body(self, entries: list[LogprobEntry]) -> dict[str, Any]:
        """A choice's `logprobs` object: chat's {"content": [...]}, or completions' parallel lists."""
        if self.endpoint == "chat":
            return {"content": [
                {"token": e.token, "logprob": e.logprob, "bytes": token_bytes(e.token),
                 "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": token_bytes(t.token)}
                                  for t in e.top]}
                for e in entries
            ]}
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries],
            "text_offset": [e.text_offset for e in entries],
        }

    def event_chunk(self, index: int, event: Event, usage: Usage | None = None) -> dict[str, Any]:
        """A chat chunk for one parsed piece of output: content, a tool call's start, or its argument text."""
        if isinstance(event, str):
            return self.text_chunk(index, event, usage)
        call: dict[str, Any]
        if isinstance(event, ToolCallStart):
            call = {"index": event.index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
        else:
            call = {"index": event.index, "function": {"arguments": event.text}}
        return self._chunk([self._choice(index, {"tool_calls": [call]}, None)], usage)

    def finish_chunk(self, index: int, finish_reason: str, usage: Usage | None = None) -> dict[str, Any]:
        return self._chunk([self._choice(index, {} if self.endpoint == "chat" else "", finish_reason)], usage)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        chunk = self._chunk([])
        chunk["usage"] = usage_body(usage)
        return chunk

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.endpoint == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage_body(usage) if self.continuous_usage and usage is not None else None
        return chunk

    def _choice(self, index: int, content: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        if self.endpoint == "chat":
            return {"index": index, "delta": content, "logprobs": None, "finish_reason": finish_reason}
        return {"index": index, "text": content, "logprobs": None, "finish_reason": finish_reason}

    # ------------------------------------------------------------------ whole response

    def response(self, texts: list[str], finish_reasons: list[str], usage: Usage,
                 logprobs: list[list[LogprobEntry]] | None = None,
                 events: list[list[Event]] | None = None) -> dict[str, Any]:
        """The whole body; `logprobs` per choice when the request asked for them (else null); `events`:
        per choice, its parsed output (content and tool calls) when the request offered tools."""
        body = self._response(texts, finish_reasons, usage, events)
        if logprobs is not None:
            for choice, entries in zip(body["choices"], logprobs, strict=True):
                choice["logprobs"] = self.logprobs_body(entries)
        return body

    def _response(self, texts: list[str], finish_reasons: list[str], usage: Usage,
                  events: list[list[Event]] | None) -> dict[str, Any]:
        if self.endpoint == "chat":
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text} if events is None else _message(events[i]),
                    "logprobs": None,
                    "finish_reason": reason,
                }
                for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
            ]
        else:
            choices = [
                {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
            ]
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_body(usage),
        }


def _message(events: list[Event]) -> dict[str, Any]:
    """An assistant message from parsed output: content (None when empty) and tool_calls when any."""
    content = "".join(e for e in events if isinstance(e, str))
    calls: list[dict[str, Any]] = []
    for e in events:
        if isinstance(e, ToolCallStart):
            calls.append({"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}})
        elif isinstance(e, ArgumentsDelta):
            calls[e.index]["function"]["arguments"] += e.text
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message
