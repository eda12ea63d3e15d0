"""From a validated, tokenized request to an HTTP response: streamed or whole.

Owns the request's path after the route parsed it: `plan` (default max_tokens,
context-length check), then `serve`: admission (key + quotas, one Redis round
trip), submission, then either an SSE stream of OpenAI chunks or one JSON
body, and in both cases the single `Generation.close()` (engine abort if still
running + usage settlement) when it ends, fails or the client goes away; for a
finished request that runs after its last byte went out, off the client's clock.
The non-streaming path watches the ASGI `http.disconnect` message while it
waits, so a client that hangs up frees its KV blocks at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import admit
from gateway.errors import APIError, InternalError
from gateway.generation import Generation, check_context
from gateway.openai_format import Endpoint, ResponseFormat, new_request_id
from gateway.schemas import GenerationSettings
from gateway.sse import DONE, SSEResponse, sse_event
from gateway.state import EngineHandle, GatewayState
from gateway.tenancy.admission import Admission
from gateway.tool_parser import ToolCallParser
from shared.sampling import SamplingParams

log = logging.getLogger("pageserve.gateway")


@dataclasses.dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    param: str
    """The body field the prompt came from ("messages" or "prompt"), for errors."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request that passed every check that needs no Redis: what `serve` admits and runs."""

    endpoint: Endpoint
    settings: GenerationSettings
    prompt: PromptInput
    sampling: SamplingParams
    """The request's sampling, max_tokens defaulted to the room left when the client gave none."""
    engine: EngineHandle


def plan(state: GatewayState, endpoint: Endpoint, settings: GenerationSettings, prompt: PromptInput) -> Plan:
    """Default max_tokens and check the context: 400 or 503 (engine down) before any quota is touched."""
    engine = state.engine_client()
    info = engine.model_info
    sampling = settings.sampling
    if not settings.max_tokens_given:
        # The room left in the context, and in the whole KV pool (the engine refuses a request
        # that could never fit: a default must not make a valid request unservable).
        limit = min(info.max_model_len, info.num_blocks * info.block_size)
        room = max(1, limit - len(prompt.token_ids))
        default = room if endpoint == "chat" else min(room, state.config.completion_default_max_tokens)
        sampling = dataclasses.replace(sampling, max_tokens=max(default, sampling.min_tokens))
    check_context(len(prompt.token_ids), sampling.max_tokens, info.max_model_len, prompt.param, settings.max_param)
    return Plan(endpoint, settings, prompt, sampling, engine)


def reservation(plan: Plan, admission: Admission | None) -> int:
    """Output tokens to reserve: n x max_tokens, or n x the configured cap when max_tokens is the default."""
    per_sample = plan.sampling.max_tokens
    if not plan.settings.max_tokens_given and admission is not None:
        per_sample = min(per_sample, admission.config.default_max_tokens)
    return plan.sampling.n * per_sample


async def serve(request: Request, state: GatewayState, plan: Plan, key: str) -> ASGIApp:
    """Admit (key and quota: one Redis round trip), submit, then stream or answer whole.

    Settlement runs after the last byte is handed to the server, so it never delays the client.
    """
    settings = plan.settings
    fmt = ResponseFormat(plan.endpoint, new_request_id(plan.endpoint), plan.engine.model_info.model_name,
                         settings.include_usage)
    caller, ticket = await admit(key, state.store, state.admission, len(plan.prompt.token_ids),
                                 reservation(plan, state.admission))
    # From here on the request is admitted: every path ends in exactly one settlement (gen.close()).
    try:
        gen = Generation(
            request_id=fmt.request_id,
            prompt_token_ids=plan.prompt.token_ids,
            sampling=plan.sampling,
            stop=settings.stop,
            caller=caller,
            tokenizer=state.prompts.tokenizer,
            ticket=ticket,
            grammar=settings.grammar,
        )
    except BaseException:
        if ticket is not None:
            await ticket.settle(0, 0, error=True)
        raise
    try:
        await gen.submit(plan.engine)
    except BaseException:
        await gen.close()
        raise
    if settings.stream:
        return SSEResponse(_stream_events(gen, fmt, settings.parse_tool_calls), on_close=gen.close,
                           headers=gen.response_headers)
    try:
        response = await _whole_response(request, gen, fmt, settings.parse_tool_calls)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await gen.close()
        raise
    return ThenClose(response, gen.close)


class ThenClose:
    """An ASGI response followed by `on_close`, exactly once, even if sending it failed."""

    def __init__(self, response: Response, on_close: Callable[[], Awaitable[None]]) -> None:
        self._response = response
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


async def _stream_events(gen: Generation, fmt: ResponseFormat, tool_calls: bool = False) -> AsyncIterator[bytes]:
    if fmt.endpoint == "chat":
        for index in range(gen.sampling.n):
            yield sse_event(fmt.role_chunk(index))
    parsers = [ToolCallParser() for _ in range(gen.sampling.n)] if tool_calls else None
    try:
        async for delta in gen.deltas():
            reason = delta.finish_reason
            if parsers is not None:  # content and tool calls, as the parser finds them
                parser = parsers[delta.index]
                for event in parser.feed(delta.text) + (parser.finish() if reason is not None else []):
                    yield sse_event(fmt.event_chunk(delta.index, event))
                reason = _with_calls(reason, parser.num_calls)
            elif delta.text:
                yield sse_event(fmt.text_chunk(delta.index, delta.text))
            if reason is not None:
                yield sse_event(fmt.finish_chunk(delta.index, reason))
    except APIError as e:
        yield sse_event(e.body())
        return
    except Exception:
        gen.failed = True
        log.exception("request %s failed mid-stream", gen.request_id)
        yield sse_event(InternalError("internal error while streaming", code="internal_error").body())
        return
    if fmt.include_usage:
        yield sse_event(fmt.usage_chunk(gen.usage))
    yield DONE


def _with_calls(reason: str | None, num_calls: int) -> str | None:
    """A choice that stopped after calling tools finishes with "tool_calls" (OpenAI's reason)."""
    return "tool_calls" if reason == "stop" and num_calls else reason


async def _whole_response(request: Request, gen: Generation, fmt: ResponseFormat,
                          tool_calls: bool = False) -> Response:
    n = gen.sampling.n
    texts: list[list[str]] = [[] for _ in range(n)]
    reasons: list[str] = ["length"] * n
    disconnected = False
    failure: APIError | None = None

    async with anyio.create_task_group() as tg:

        async def collect() -> None:
            nonlocal failure
            try:
                async for delta in gen.deltas():
                    texts[delta.index].append(delta.text)
                    if delta.finish_reason is not None:
                        reasons[delta.index] = delta.finish_reason
            except APIError as e:  # raised out of the task group it would arrive as an ExceptionGroup
                failure = e
            tg.cancel_scope.cancel()

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while (await request.receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            tg.cancel_scope.cancel()

        tg.start_soon(collect)
        tg.start_soon(watch_disconnect)

    if failure is not None:
        raise failure
    if disconnected:
        log.info("client of %s went away; aborting it", gen.request_id)
        return Response(status_code=499)  # nobody reads it; the finally aborts the engine request
    whole = ["".join(t) for t in texts]
    events = None
    if tool_calls:
        parsers = [ToolCallParser() for _ in range(n)]
        events = [p.feed(text) + p.finish() for p, text in zip(parsers, whole, strict=True)]
        reasons = [_with_calls(r, p.num_calls) or r for r, p in zip(reasons, parsers, strict=True)]
    body = fmt.response(whole, reasons, gen.usage, events)
    return JSONResponse(body, headers=gen.response_headers)
