"""One streamed request to any OpenAI-compatible server, timed chunk by chunk (httpx, SSE).

    target = Target("pageserve", "http://127.0.0.1:8000", "smollm2", {"default": "ps-..."}, "completions")
    timing = await send_openai(client, target, index, request, t0)

`completions` sends the workload's token ids as the prompt (exact prompt lengths on
every server that accepts token-id prompts: ours, vLLM); `chat` sends them decoded to
text as one user message (lengths then follow the server's chat template). Always
greedy, `ignore_eos`, `stream_options.include_usage` (not vLLM's
continuous_usage_stats: clients must not need it). TTFT is stamped at the first chunk
whose text is non-empty - a role-only chunk is no token. The output token count comes
from the final usage chunk (content chunks counted when a server sends none); fewer
tokens than asked is an error of kind "incomplete". This module owns the wire side
of the load generator; arrival times and statistics live elsewhere.
"""

from __future__ import annotations

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
                if chunk_text(chunk):
                    stamps.append(time.perf_counter())
                usage = chunk.get("usage") or usage
    except httpx.TimeoutException:
        return _failed(base, "timeout")
    except httpx.HTTPError as e:
        return _failed(base, type(e).__name__)
    end = time.perf_counter()
    return _finished(base, req, sent, stamps, end, usage)


def _finished(base: RequestTiming, req: WorkloadRequest, sent: float, stamps: list[float], end: float,
              usage: dict[str, Any] | None) -> RequestTiming:
    produced = int(usage["completion_tokens"]) if usage else len(stamps)
    prompt = int(usage["prompt_tokens"]) if usage else base.prompt_tokens
    if not stamps:
        return _failed(base, "no content")
    timing = RequestTiming(base.index, base.tenant, base.start, prompt, produced, stamps[0] - sent, end - sent,
                           tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False)))
    if produced < req.output_len:
        return _failed(timing, f"incomplete: {produced}/{req.output_len} tokens")
    return timing


def _failed(t: RequestTiming, kind: str) -> RequestTiming:
    return RequestTiming(t.index, t.tenant, t.start, t.prompt_tokens, t.output_tokens, t.ttft, t.e2e, t.itl, kind)


def _error_code(r: httpx.Response) -> str:
    try:
        err = r.json().get("error") or {}
    except ValueError:
        return ""
    code = err.get("code") or err.get("type")
    return f" {code}" if code else ""
