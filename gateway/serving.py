"""From a validated, tokenized request to an HTTP response: streamed or whole.

Owns the request's path after the route parsed it: `plan` (token ids inside the engine's
vocabulary, then the final sampling and reservation from gateway/sampling_plan.py), then `serve`: admission (key + quotas, one Redis round
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
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import admit
from gateway.errors import APIError, InternalError
from gateway.generation import Generation
from gateway.logprobs import LogprobEntry
from gateway.models_api import lora_name_for
from gateway.openai_format import Endpoint, ResponseFormat, id_prefix, new_request_id
from gateway.request_context import record_of
from gateway.sampling_plan import DecidedSampling, OutputLimits, decide_sampling
from gateway.schemas import GenerationSettings
from gateway.sse import DONE, SSEResponse, sse_event
from gateway.state import EngineHandle, GatewayState
from gateway.token_limits import check_token_ids, vocab_size_of
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
    engine: EngineHandle
    decided: DecidedSampling
    """The final sampling parameters and the output tokens admission reserves, decided together."""

    @property
    def sampling(self) -> SamplingParams:
        return self.decided.sampling


def plan(state: GatewayState, endpoint: Endpoint, settings: GenerationSettings, prompt: PromptInput) -> Plan:
    """Token ids checked against the engine's vocabulary, then the final sampling parameters and the
    reservation (gateway/sampling_plan.py); 400 or 503 (engine down) before any quota is touched."""
    engine = state.engine_client()
    info = engine.model_info
    vocab = vocab_size_of(info.vocab_size, state.prompts.vocab_size)
    check_token_ids(prompt.token_ids, vocab, prompt.param)
    check_token_ids(settings.stop_token_ids, vocab, "stop_token_ids")
    cap = state.admission.config.default_max_tokens if state.admission is not None else None
    limits = OutputLimits(state.config.completion_default_max_tokens, reservation_cap=cap)
    decided = decide_sampling(endpoint, settings, len(prompt.token_ids), prompt.param, info, limits)
    return Plan(endpoint, settings, prompt, engine, decided)


async def serve(request: Request, state: GatewayState, plan: Plan, key: str) -> ASGIApp:
    """Admit (key and quota: one Redis round trip), submit, then stream or answer whole.

    Settlement runs after the last byte is handed to the server, so it never delays the client.
    """
    settings = plan.settings
    record = record_of(request)
    request_id = record.engine_id(id_prefix(plan.endpoint)) if record is not None else new_request_id(plan.endpoint)
    lora_name = lora_name_for(plan.engine.model_info, settings.model)
    fmt = ResponseFormat(plan.endpoint, request_id, lora_name or plan.engine.model_info.model_name,
                         settings.include_usage, settings.continuous_usage)
    admission_started = time.perf_counter()
    try:
        caller, ticket = await admit(key, state.store, state.admission, len(plan.prompt.token_ids),
                                     plan.decided.reserved_output_tokens, state.outage)
    finally:
        if record is not None:
            record.admission_s = time.perf_counter() - admission_started
    if record is not None:
        record.tenant, record.model_name = caller.tenant, fmt.model
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
            observer=record,
            grammar=settings.grammar,
            lora_name=lora_name,
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
    if record is not None:
        record.submitted = True
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
    # A chat choice's role chunk goes out with its first generated token, not at admission (vLLM's
    # order): clients stamp time to first token at the first chunk. A stream that ends before any
    # token carries no role chunk, only its error event. Every token goes out as a chunk, with empty
    # text when the detokenizer holds its text back (the first bytes of a character, a possible stop
    # string): clients that count or time tokens by chunks (vllm bench serve's inter-token latency)
    # see each token when it is made, not two at once a step later. With tools offered, the parser
    # turns the text into content and tool-call deltas as it finds them.
    announced: set[int] = set()
    parsers = [ToolCallParser() for _ in range(gen.sampling.n)] if tool_calls else None
    try:
        async for delta in gen.deltas():
            if fmt.endpoint == "chat" and delta.index not in announced:
                announced.add(delta.index)
                yield sse_event(fmt.role_chunk(delta.index, gen.usage))
            reason = delta.finish_reason
            if parsers is not None:
                parser = parsers[delta.index]
                for event in parser.feed(delta.text) + (parser.finish() if reason is not None else []):
                    yield sse_event(fmt.event_chunk(delta.index, event, gen.usage))
                reason = _with_calls(reason, parser.num_calls)
            elif delta.text or delta.logprobs or reason is None:  # one chunk per token, its text held back or not
                yield sse_event(fmt.text_chunk(delta.index, delta.text, gen.usage, delta.logprobs))
            if reason is not None:
                yield sse_event(fmt.finish_chunk(delta.index, reason, gen.usage))
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
    logprobs: list[list[LogprobEntry]] = [[] for _ in range(n)]
    reasons: list[str] = ["length"] * n
    disconnected = False
    failure: APIError | None = None

    async with anyio.create_task_group() as tg:

        async def collect() -> None:
            nonlocal failure
            try:
                async for delta in gen.deltas():
                    texts[delta.index].append(delta.text)
                    logprobs[delta.index] += delta.logprobs
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
    body = fmt.response(whole, reasons, gen.usage, logprobs if gen.sampling.logprobs is not None else None, events)
    return JSONResponse(body, headers=gen.response_headers)
