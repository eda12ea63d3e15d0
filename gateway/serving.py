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
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from types import MappingProxyType
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import admit
from gateway.errors import APIError, InternalError
from gateway.generation import Generation
from gateway.logprobs import LogprobEntry, TokenTexts
from gateway.models_api import lora_name_for
from gateway.openai_format import Endpoint, ResponseFormat, id_prefix
from gateway.output_options import bad_words_token_ids, truncate_prompt
from gateway.prompt_echo import echo_choice, echo_logprobs, prompt_fields, prompt_logprobs_body
from gateway.prompts import Prompts
from gateway.request_context import RequestRecord, record_of
from gateway.sampling_plan import DecidedSampling, OutputLimits, decide_sampling
from gateway.schemas import GenerationSettings
from gateway.sse import DONE, SSEResponse, sse_event
from gateway.state import EngineHandle, GatewayState
from gateway.tenancy.admission import Ticket
from gateway.tenancy.store import AuthContext
from gateway.token_limits import check_token_ids, vocab_size_of
from gateway.tool_parser import ToolCallParser
from shared.sampling import SamplingParams

log = logging.getLogger("pageserve.gateway")


@dataclasses.dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    param: str
    """The body field the prompt came from ("messages" or "prompt"), for errors."""
    text: str | None = None
    """A completion's prompt as the client wrote it (what echo returns); None: decoded from the ids."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request that passed every check that needs no Redis: what `serve` admits and runs."""

    endpoint: Endpoint
    settings: GenerationSettings
    prompt: PromptInput
    engine: EngineHandle
    decided: DecidedSampling
    """The final sampling parameters and the output tokens admission reserves, decided together."""
    prompts: Prompts
    """The served model's tokenizer (detokenizes the output)."""
    model_id: str = ""
    """The served model id (after aliases and fallbacks); '' for the one engine of a unit test."""
    requested: str = ""
    """The name the client sent (a 404 after admission repeats it)."""

    @property
    def sampling(self) -> SamplingParams:
        return self.decided.sampling


def plan(state: GatewayState, endpoint: Endpoint, settings: GenerationSettings, prompt: PromptInput,
         model_id: str = "", prompts: Prompts | None = None) -> Plan:
    """Token ids checked against the engine's vocabulary, then the final sampling parameters and the
    reservation (gateway/sampling_plan.py); 400 or 503 (engine down) before any quota is touched.
    With `model_id`, the engine is that model's replicas only."""
    engine = state.models.engine_for(model_id, state.engine) if model_id else state.engine_client()
    prompts = prompts or state.prompts
    info = engine.model_info
    settings, prompt = _apply_output_options(state, settings, prompt, info.max_model_len, prompts)
    vocab = vocab_size_of(info.vocab_size, prompts.vocab_size)
    check_token_ids(prompt.token_ids, vocab, prompt.param)
    check_token_ids(settings.stop_token_ids, vocab, "stop_token_ids")
    cap = state.admission.config.default_max_tokens if state.admission is not None else None
    limits = OutputLimits(state.config.completion_default_max_tokens, reservation_cap=cap)
    decided = decide_sampling(endpoint, settings, len(prompt.token_ids), prompt.param, info, limits)
    return Plan(endpoint, settings, prompt, engine, decided, prompts, model_id, settings.model)


def _apply_output_options(state: GatewayState, settings: GenerationSettings, prompt: PromptInput,
                          max_model_len: int, prompts: Prompts) -> tuple[GenerationSettings, PromptInput]:
    """truncate_prompt_tokens on the ids, bad_words tokenized into the sampling fields (vLLM's rules)."""
    out = settings.output
    keep = out.truncate_prompt_tokens
    if keep is not None and keep < len(prompt.token_ids) or keep == -1:
        ids = truncate_prompt(prompt.token_ids, keep, max_model_len)
        prompt = dataclasses.replace(prompt, token_ids=ids, text=None if ids != prompt.token_ids else prompt.text)
    if out.bad_words:
        words = bad_words_token_ids(out.bad_words, prompts.tokenizer)
        fields = MappingProxyType({**settings.sampling_fields, "bad_words_token_ids": words})
        settings = dataclasses.replace(settings, sampling_fields=fields)
    return settings, prompt


class Responder(Protocol):
    """Another response shape over the same generation (gateway/responses_api.py's /v1/responses)."""

    id_prefix: str

    def events(self, gen: Generation, request_id: str) -> AsyncIterator[bytes]:
        """The whole SSE stream of a streamed request."""
        ...

    def body(self, gen: Generation, request_id: str, text: str, finish_reason: str) -> dict[str, Any]:
        """The JSON body of a whole request (one choice)."""
        ...


def _response_format(plan: Plan, record: RequestRecord | None,
                     responder: Responder | None) -> tuple[ResponseFormat, str]:
    """The response's id and shape, and the LoRA adapter the body's model names ("": the base model,
    whose name responses echo; an adapter's name is echoed instead)."""
    settings = plan.settings
    prefix = responder.id_prefix if responder is not None else id_prefix(plan.endpoint)
    request_id = record.engine_id(prefix) if record is not None else prefix + uuid.uuid4().hex
    lora_name = lora_name_for(plan.engine.model_info, plan.model_id or settings.model)  # after aliases
    return ResponseFormat(plan.endpoint, request_id, lora_name or plan.engine.model_info.model_name,
                          settings.include_usage, settings.continuous_usage), lora_name


async def serve(request: Request, state: GatewayState, plan: Plan, key: str,
                responder: Responder | None = None) -> ASGIApp:
    """Admit (key and quota: one Redis round trip), submit, then stream or answer whole, in OpenAI's
    chat or completions shapes, or `responder`'s.

    Settlement runs after the last byte is handed to the server, so it never delays the client.
    """
    settings = plan.settings
    record = record_of(request)
    fmt, lora_name = _response_format(plan, record, responder)
    request_id = fmt.request_id
    caller, ticket = await _admit(state, plan, key, record)
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
            tokenizer=plan.prompts.tokenizer,
            ticket=ticket,
            observer=record,
            grammar=settings.grammar,
            options=settings.output,
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
    parts = PromptParts(gen, plan.prompt, fmt.endpoint == "chat")
    if settings.stream:
        events = (_stream_events(gen, fmt, settings.parse_tool_calls, parts) if responder is None
                  else responder.events(gen, request_id))
        return SSEResponse(events, on_close=gen.close, headers=gen.response_headers)
    try:
        response = await _whole_response(request, gen, fmt, settings.parse_tool_calls, parts, responder)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await gen.close()
        raise
    return ThenClose(response, gen.close)


async def _admit(state: GatewayState, plan: Plan, key: str,
                 record: RequestRecord | None) -> tuple[AuthContext, Ticket | None]:
    """Key and quotas in one Redis round trip (timed for the request's record), then the model list as
    admission read it."""
    admission_started = time.perf_counter()
    try:
        caller, ticket = await admit(key, state.store, state.admission, len(plan.prompt.token_ids),
                                     plan.decided.reserved_output_tokens, state.outage, plan.model_id,
                                     state.config.models.cost_weights.get(plan.model_id, 1.0))
    finally:
        if record is not None:
            record.admission_s = time.perf_counter() - admission_started
    await _recheck_model(state, plan, caller, ticket)
    return caller, ticket


async def _recheck_model(state: GatewayState, plan: Plan, caller: AuthContext, ticket: Ticket | None) -> None:
    """The model list as admission just read it: a change since the key check holds now (nothing charged)."""
    if not plan.model_id:
        return
    try:
        state.models.recheck(plan.requested, plan.model_id, caller.models, state.engine)
    except BaseException:
        if ticket is not None:
            await ticket.settle(0, 0, error=True)
        raise


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


class PromptParts:
    """A request's prompt-side additions (echo, prompt logprobs, token ids), added to a whole body or to
    each choice's first chunk (gateway/prompt_echo.py); the prompt logprobs exist after the first delta."""

    def __init__(self, gen: Generation, prompt: PromptInput, chat: bool) -> None:
        self.gen, self.prompt, self.chat = gen, prompt, chat
        self.options = gen.options
        self._text_of = TokenTexts(gen.tokenizer, 1).text

    @property
    def active(self) -> bool:
        """Anything to add: a completions stream then opens each choice with a chunk of its own."""
        o = self.options
        return o.echo or o.return_token_ids or self.gen.sampling.prompt_logprobs is not None

    def add(self, body: dict[str, Any], choice: dict[str, Any]) -> None:
        ids = self.prompt.token_ids
        lps = self.gen.prompt_logprobs
        wants = self.gen.sampling.prompt_logprobs is not None
        if self.options.echo:
            text = self.prompt.text
            if text is None:
                text = self.gen.tokenizer.decode(ids, skip_special_tokens=self.options.skip_special_tokens)
            echo_choice(choice, text, echo_logprobs(ids, lps, self._text_of) if wants else None,
                        self.options.prompt_only)
        plp = prompt_logprobs_body(ids, lps, self._text_of) if wants and not self.options.echo else None
        prompt_fields(body, choice, self.chat, ids if self.options.return_token_ids else None, plp)

    def whole(self, body: dict[str, Any], token_ids: list[list[int]]) -> None:
        for choice, ids in zip(body["choices"], token_ids, strict=True):
            if self.options.return_token_ids:
                choice["token_ids"] = [] if self.options.prompt_only else ids
            self.add(body, choice)


async def _stream_events(gen: Generation, fmt: ResponseFormat, tool_calls: bool = False,
                         parts: PromptParts | None = None) -> AsyncIterator[bytes]:
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
            if delta.index not in announced:
                announced.add(delta.index)
                first = fmt.role_chunk(delta.index, gen.usage) if fmt.endpoint == "chat" else (
                    fmt.text_chunk(delta.index, "", gen.usage))
                if parts is not None:
                    parts.add(first, first["choices"][0])
                if fmt.endpoint == "chat" or (parts is not None and parts.active):
                    yield sse_event(first)
            reason = delta.finish_reason
            if parsers is not None:
                parser = parsers[delta.index]
                for event in parser.feed(delta.text) + (parser.finish() if reason is not None else []):
                    yield sse_event(fmt.event_chunk(delta.index, event, gen.usage))
                reason = _with_calls(reason, parser.num_calls)
            elif delta.text or delta.logprobs or reason is None:  # one chunk per token, its text held back or not
                chunk = fmt.text_chunk(delta.index, delta.text, gen.usage, delta.logprobs)
                if gen.options.return_token_ids:
                    chunk["choices"][0]["token_ids"] = delta.token_ids
                yield sse_event(chunk)
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
                          tool_calls: bool = False, parts: PromptParts | None = None,
                          responder: Responder | None = None) -> Response:
    n = gen.sampling.n
    texts: list[list[str]] = [[] for _ in range(n)]
    token_ids: list[list[int]] = [[] for _ in range(n)]
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
                    token_ids[delta.index] += delta.token_ids
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
    if responder is not None:
        return JSONResponse(responder.body(gen, fmt.request_id, whole[0], reasons[0]), headers=gen.response_headers)
    events = None
    if tool_calls:
        parsers = [ToolCallParser() for _ in range(n)]
        events = [p.feed(text) + p.finish() for p, text in zip(parsers, whole, strict=True)]
        reasons = [_with_calls(r, p.num_calls) or r for r, p in zip(reasons, parsers, strict=True)]
    wants_logprobs = gen.sampling.logprobs is not None and not gen.options.prompt_only
    body = fmt.response(whole, reasons, gen.usage, logprobs if wants_logprobs else None, events)
    if parts is not None:
        parts.whole(body, token_ids)
    return JSONResponse(body, headers=gen.response_headers)
