"""From a validated, tokenized request to an HTTP response: streamed or whole.

Owns the request's path after the route parsed it: context-length check,
admission, submission, then either an SSE stream of OpenAI chunks or one JSON
body, and in both cases the single `Generation.close()` (engine abort if still
running + usage settlement) when it ends, fails or the client goes away.
The non-streaming path watches the ASGI `http.disconnect` message while it
waits, so a client that hangs up frees its KV blocks at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import APIError, InternalError
from gateway.generation import Caller, Generation, check_context
from gateway.openai_format import Endpoint, ResponseFormat, new_request_id
from gateway.schemas import GenerationSettings
from gateway.sse import DONE, SSEResponse, sse_event
from gateway.state import GatewayState

log = logging.getLogger("pageserve.gateway")


@dataclasses.dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    param: str
    """The body field the prompt came from ("messages" or "prompt"), for errors."""


async def serve(
    request: Request,
    state: GatewayState,
    endpoint: Endpoint,
    settings: GenerationSettings,
    prompt: PromptInput,
    caller: Caller,
) -> Response | SSEResponse:
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

    fmt = ResponseFormat(endpoint, new_request_id(endpoint), info.model_name, settings.include_usage)
    gen = Generation(
        request_id=fmt.request_id,
        prompt_token_ids=prompt.token_ids,
        sampling=sampling,
        stop=settings.stop,
        caller=caller,
        tokenizer=state.prompts.tokenizer,
        admission=state.admission,
        max_tokens_given=settings.max_tokens_given,
    )
    await gen.admit()
    # From here on the request is admitted: every path ends in exactly one gen.close().
    try:
        await gen.submit(engine)
    except BaseException:
        await gen.close()
        raise
    if settings.stream:
        return SSEResponse(_stream_events(gen, fmt), on_close=gen.close, headers=gen.response_headers)
    try:
        return await _whole_response(request, gen, fmt)
    finally:
        with anyio.CancelScope(shield=True):
            await gen.close()


async def _stream_events(gen: Generation, fmt: ResponseFormat) -> AsyncIterator[bytes]:
    if fmt.endpoint == "chat":
        for index in range(gen.sampling.n):
            yield sse_event(fmt.role_chunk(index))
    try:
        async for delta in gen.deltas():
            if delta.text:
                yield sse_event(fmt.text_chunk(delta.index, delta.text))
            if delta.finish_reason is not None:
                yield sse_event(fmt.finish_chunk(delta.index, delta.finish_reason))
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


async def _whole_response(request: Request, gen: Generation, fmt: ResponseFormat) -> Response:
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
    body = fmt.response(["".join(t) for t in texts], reasons, gen.usage)
    return JSONResponse(body, headers=gen.response_headers)
