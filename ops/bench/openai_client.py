"""One streamed request to any OpenAI-compatible server, timed chunk by chunk (httpx, SSE).

    target = Target("pageserve", "http://127.0.0.1:8000", "smollm2", {"default": "ps-..."}, "completions")
    timing = await send_openai(client, target, index, request, t0)

`completions` sends the workload's token ids as the prompt (exact prompt lengths on
every server that accepts token-id prompts: ours, vLLM); `chat` sends them decoded to
text as one user message (lengths then follow the server's chat template). Always
greedy, `ignore_eos`, `stream_options.include_usage` (not vLLM's
continuous_usage_stats: clients must not need it). A token's arrival is stamped at its
chunk (`token_arrived`), as `vllm bench serve` stamps every chunk with a choice: TTFT at the
first, inter-token gaps between them. A token whose text is held back (the first half of a
character's UTF-8 bytes, a possible stop string) has arrived all the same; stamping only chunks
with text would time two steps as one gap for each (3 of 32 requests of
`--random 32 128 64` write such text: 67 of 2,016 gaps, over 3%, so the p99 was a double step).
A role-only chunk and a finish-only chunk are no token. The output token count comes
from the final usage chunk (content chunks counted when a server sends none); fewer
tokens than asked is an error of kind "incomplete". This module owns the wire side
of the load generator; arrival times and statistics live elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ops.bench.serve_stats import RequestTiming
from ops.bench.workloads import WorkloadRequest

ENDPOINTS = ("completions", "chat")


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str
    model: str
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant -> API key; a tenant missing here uses the key of "default" (or none)."""
    endpoint: str = "completions"
    detokenize: Callable[[list[int]], str] | None = None
    """For the chat endpoint: token ids -> message text."""

    def headers(self, tenant: str) -> dict[str, str]:
        key = self.keys.get(tenant) or self.keys.get("default")
        return {"Authorization": f"Bearer {key}"} if key else {}


def request_body(target: Target, req: WorkloadRequest) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": target.model, "max_tokens": req.output_len, "temperature": 0.0,
                            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    if target.endpoint == "chat":
        if target.detokenize is None:
            raise ValueError("the chat endpoint needs a detokenizer for the workload's token ids")
        body["messages"] = [{"role": "user", "content": target.detokenize(list(req.prompt))}]
        return "/v1/chat/completions", body
    body["prompt"] = list(req.prompt)
    return "/v1/completions", body


def token_arrived(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries a generated token: text, or an empty text delta (the token's text
    held back); not a chat role announcement, not a finish or usage chunk without text."""
    choices = chunk.get("choices") or []
    if not choices:
        return False
    first = choices[0]
    if chunk_text(chunk):
        return True
    if first.get("finish_reason") is not None:
        return False
    if "delta" in first:
        delta = first["delta"]
        return "role" not in delta and ("content" in delta or "tool_calls" in delta)
    return "text" in first


def chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    if "delta" in first:
        return first["delta"].get("content") or ""
    return first.get("text") or ""


async def send_openai(client: httpx.AsyncClient, target: Target, index: int, req: WorkloadRequest,
                      t0: float) -> RequestTiming:
    path, body = request_body(target, req)
    base = RequestTiming(index, req.tenant, time.perf_counter() - t0, len(req.prompt))
    sent = time.perf_counter()
    stamps: list[float] = []
    text_stamps: list[float] = []
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", target.base_url.rstrip("/") + path, json=body,
                                 headers=target.headers(req.tenant)) as r:
            if r.status_code != 200:
                await r.aread()
                return _failed(base, f"http {r.status_code}{_error_code(r)}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return _failed(base, f"stream error {chunk['error'].get('type', '')}".strip())
                if token_arrived(chunk):
                    stamps.append(time.perf_counter())
                    if chunk_text(chunk):
                        text_stamps.append(stamps[-1])
                usage = chunk.get("usage") or usage
    except httpx.TimeoutException:
        return _failed(base, "timeout")
    except httpx.HTTPError as e:
        return _failed(base, type(e).__name__)
    end = time.perf_counter()
    return _finished(base, req, sent, (stamps, text_stamps), end, usage)


def _finished(base: RequestTiming, req: WorkloadRequest, sent: float, arrivals: tuple[list[float], list[float]],
              end: float, usage: dict[str, Any] | None) -> RequestTiming:
    """`arrivals`: the stamps of token chunks and of those with text."""
    stamps, text_stamps = arrivals
    produced = int(usage["completion_tokens"]) if usage else len(stamps)
    prompt = int(usage["prompt_tokens"]) if usage else base.prompt_tokens
    if not stamps:
        return _failed(base, "no content")
    timing = RequestTiming(base.index, base.tenant, base.start, prompt, produced, stamps[0] - sent, end - sent,
                           _gaps(stamps), text_itl=_gaps(text_stamps))
    if produced < req.output_len:
        return _failed(timing, f"incomplete: {produced}/{req.output_len} tokens")
    return timing


def _gaps(stamps: list[float]) -> tuple[float, ...]:
    return tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def _failed(t: RequestTiming, kind: str) -> RequestTiming:
    return dataclasses.replace(t, error=kind)


def _error_code(r: httpx.Response) -> str:
    try:
        err = r.json().get("error") or {}
    except ValueError:
        return ""
    code = err.get("code") or err.get("type")
    return f" {code}" if code else ""
