"""One admitted request in flight: engine token deltas in, text deltas per choice out.

Owns the life of an admitted request (`gateway/auth.py` admits it and hands
over its ticket): `submit` to the engine, `deltas()` turning each sample's tokens into
text (incremental detokenizer + stop strings), and `close` (the one place a
request ends: abort in the engine if it is still running, then settle usage).
`close` is idempotent and is called from exactly one `finally` per request,
whether it finished, hit a stop string, failed, or its client went away.

Usage counts what the client was given: prompt tokens once (not times n), and
per sample the generated tokens consumed up to its end (for a stop string, up
to the token that completed it; for a cut stream, up to the cut).

It knows nothing about HTTP or OpenAI's JSON shapes; it never imports torch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.detokenizer import IncrementalDetokenizer, Tokenizer
from gateway.engine_client import EngineDeadError, EngineError, RequestFailedError
from gateway.errors import APIError, EngineUnavailable, InternalError, InvalidRequest, NotFound
from gateway.logprobs import LogprobEntry, TokenTexts
from gateway.output_options import OutputOptions
from gateway.stop_strings import StopStringMatcher
from gateway.tenancy.admission import Principal, Ticket
from shared.protocol import (
    DEADLINE_EXCEEDED,
    MODEL_NOT_FOUND,
    REQUEST_FAILED,
    AddRequest,
    Finished,
    TokenDelta,
    TokenLogprob,
)
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

log = logging.getLogger("pageserve.gateway")


class TokenStream(Protocol):
    """One request's outputs: `RequestStream`, or gateway/replicas/failover.py's across replicas."""

    @property
    def finished(self) -> bool: ...
    def __aiter__(self) -> AsyncIterator[TokenDelta | Finished]: ...
    async def aclose(self) -> None: ...


class Engine(Protocol):
    """What a generation needs from `EngineClient` or the replica router (a fake in unit tests)."""

    async def submit(self, request: AddRequest) -> TokenStream: ...


class Caller(Principal, Protocol):
    """Who is asking: the authenticated key's context (tenancy's AuthContext): who admission charges, and
    what the engine schedules and salts the prefix cache by."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def weight(self) -> float: ...
    @property
    def cache_salt(self) -> str: ...


class Observer(Protocol):
    """Sees a request's tokens arrive and its end (gateway/request_context.py's RequestRecord: metrics, logs)."""

    def on_tokens(self, num_tokens: int) -> None: ...
    def on_end(self, prompt: int, completion: int, cached: int, outcome: str, reasons: list[str]) -> None: ...
    def on_queued(self, seconds: float) -> None:
        """The engine's queue time of the request (from its Finished; the same for every sample)."""
        ...


@dataclass(frozen=True)
class ChoiceDelta:
    index: int
    text: str
    finish_reason: str | None = None
    """"stop" or "length" on the last delta of a choice."""
    logprobs: list[LogprobEntry] = field(default_factory=list)
    """The tokens this delta consumed, when the request asked for logprobs (their text may still be
    held back by a possible stop string: logprobs go out with the token, text when it is final)."""
    token_ids: list[int] = field(default_factory=list)
    """The tokens this delta consumed (return_token_ids)."""


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class _Sample:
    detok: IncrementalDetokenizer
    stops: StopStringMatcher
    finish_reason: str | None = None


@dataclass
class Generation:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stop: Sequence[str]
    caller: Caller
    tokenizer: Tokenizer
    arrival_time: float = field(default_factory=time.time)
    response_headers: dict[str, str] = field(default_factory=dict)
    """Sent with the response (the ticket's x-ratelimit-* headers are added here)."""
    ticket: Ticket | None = None
    """The request's quota reservation (gateway/tenancy/admission.py), settled by `close`;
    None runs without quotas (unit tests)."""
    observer: Observer | None = None
    """Told of token arrivals and the end (metrics and the access log); None in unit tests."""
    grammar: GrammarSpec | None = None
    """Structured output the engine constrains every sample to."""
    lora_name: str = ""
    """The LoRA adapter the body's `model` named ("": the base model)."""
    options: OutputOptions = OutputOptions()
    """vLLM's text options (special tokens, stop string kept, prompt only)."""
    prompt_logprobs: list[TokenLogprob] = field(init=False, default_factory=list)
    """The engine's prompt logprobs (tokens 1.. of the prompt), when the request asked for them."""
    failed: bool = field(init=False, default=False)
    """The request ended in an error (engine or internal), not by finishing or a client leaving."""
    usage: Usage = field(init=False)
    _samples: list[_Sample] = field(init=False)
    _stream: TokenStream | None = field(init=False, default=None)
    _closed: bool = field(init=False, default=False)
    _token_texts: TokenTexts | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.usage = Usage(prompt_tokens=len(self.prompt_token_ids))
        self._samples = [
            _Sample(IncrementalDetokenizer(self.tokenizer, self.prompt_token_ids, self.options.skip_special_tokens),
                    StopStringMatcher(self.stop, self.options.include_stop_str))
            for _ in range(self.sampling.n)
        ]
        if self.ticket is not None:
            self.response_headers.update(self.ticket.headers)
        self._token_texts = TokenTexts(self.tokenizer, self.sampling.n) if self.sampling.logprobs is not None else None

    async def settle(self) -> None:
        """The one place a finished request's usage is recorded (called once, from `close`).

        `self.usage` is exactly what the client was sent; the ticket settles it
        exactly once (a Redis outage defers it, never raises here).
        """
        if self.ticket is None:
            return
        if self._stream is None:  # the engine never took it: nothing was served, nothing is charged
            await self.ticket.settle(0, 0, 0, error=True)
            return
        u = self.usage
        await self.ticket.settle(u.prompt_tokens, u.completion_tokens, u.cached_tokens, error=self.failed)

    async def submit(self, engine: Engine) -> None:
        request = AddRequest(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling=self.sampling,
            priority=self.caller.priority,
            tenant_id=self.caller.tenant_id,
            arrival_time=self.arrival_time,
            weight=self.caller.weight,
            cache_salt=self.caller.cache_salt,
            grammar=self.grammar,
            lora_name=self.lora_name,
        )
        try:
            self._stream = await engine.submit(request)
        except EngineError as e:
            raise _as_api_error(e) from None

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Text per choice as it becomes final; ends once every choice has finished."""
        assert self._stream is not None, "submit() first"
        try:
            async for item in self._stream:
                sample = self._samples[item.index]
                if sample.finish_reason is not None:
                    continue  # n > 1: this sample hit a stop string, the others go on
                out = self._on_delta(sample, item) if isinstance(item, TokenDelta) else self._on_finished(sample, item)
                for delta in out:
                    yield delta
                if all(s.finish_reason is not None for s in self._samples):
                    return
        except EngineError as e:
            self.failed = True
            if isinstance(e, RequestFailedError) and e.code == MODEL_NOT_FOUND:  # unloaded since Ready: as unknown
                raise NotFound(f"the model {self.lora_name[:128]!r} does not exist", param="model",
                               code="model_not_found") from None
            if (isinstance(e, RequestFailedError) and e.code not in (REQUEST_FAILED, DEADLINE_EXCEEDED)
                    and self.usage.completion_tokens == 0):
                # Refused before any output: the engine's admission checks (request_checks.py)
                # found a request that can never run here (KV blocks, n, context): the caller's fault.
                raise InvalidRequest(f"the engine refused the request: {e}", param=e.param or None,
                                     code="request_rejected") from None
            raise _as_api_error(e) from None
        except APIError:
            self.failed = True
            raise
        except Exception as e:  # detokenising or stop strings broke on this stream: it fails, nobody else
            self.failed = True
            log.exception("request %s failed while turning tokens into text", self.request_id)
            raise InternalError(f"internal error while generating ({type(e).__name__})",
                                code="internal_error") from e

    def _on_delta(self, sample: _Sample, item: TokenDelta) -> list[ChoiceDelta]:
        if item.prompt_logprobs:
            self.prompt_logprobs = list(item.prompt_logprobs)
        if self.options.prompt_only:  # max_tokens 0: the one sampled token is dropped, never counted
            self.usage.cached_tokens = item.num_cached_tokens
            return [ChoiceDelta(item.index, "")]
        out = self._text_deltas(sample, item)
        if out:
            out[0] = dataclasses.replace(out[0], token_ids=list(item.new_token_ids))
        if self._token_texts is None or not item.logprobs:
            return out
        entries = self._token_texts.entries(item.index, item.new_token_ids, item.logprobs)
        if out and out[0].finish_reason is None:
            return [dataclasses.replace(out[0], logprobs=entries), *out[1:]]
        return [ChoiceDelta(item.index, "", logprobs=entries), *out]

    def _text_deltas(self, sample: _Sample, item: TokenDelta) -> list[ChoiceDelta]:
        self.usage.cached_tokens = item.num_cached_tokens
        self.usage.completion_tokens += len(item.new_token_ids) + item.num_unreturned_tokens  # best_of: all candidates
        if self.observer is not None:
            self.observer.on_tokens(len(item.new_token_ids))
        text = sample.detok.push(item.new_token_ids)
        if sample.detok.num_tokens < self.sampling.min_tokens:
            # Like stop token ids, stop strings do not count before min_tokens (vLLM's rule).
            return [ChoiceDelta(item.index, text)]
        result = sample.stops.feed(text)
        # A delta even when the text is held back (partial UTF-8, a possible stop string): a stream
        # announces its choice at the first token, not at the first printable text.
        out = [ChoiceDelta(item.index, result.text)]
        if result.stopped:
            sample.finish_reason = "stop"
            out.append(ChoiceDelta(item.index, "", "stop"))
        return out

    def _on_finished(self, sample: _Sample, item: Finished) -> list[ChoiceDelta]:
        if item.reason == "abort":
            # We abort only samples already finished (skipped above): the engine gave up on it.
            raise EngineUnavailable("the engine aborted the request (it is shutting down)", code="engine_abort")
        self.usage.cached_tokens = item.usage.cached_tokens
        sample.finish_reason = item.reason
        if item.queue_seconds is not None and self.observer is not None:
            self.observer.on_queued(item.queue_seconds)
        tail = sample.stops.flush()
        return [ChoiceDelta(item.index, tail, item.reason)]

    async def close(self) -> None:
        """End the request: abort it in the engine if still running, then settle. Idempotent."""
        if self._closed:
            return
        self._closed = True
        cut = self._stream is not None and not self._stream.finished
        try:
            if self._stream is not None:
                await self._stream.aclose()
        finally:
            await self.settle()
        # One line per request: ids and counts only (never a key, never prompt or output text).
        reasons = ",".join(s.finish_reason or "-" for s in self._samples)
        outcome = "failed" if self.failed else "aborted" if cut and "-" in reasons else reasons
        u = self.usage
        if self.observer is not None:
            self.observer.on_end(u.prompt_tokens, u.completion_tokens, u.cached_tokens, outcome,
                                 [s.finish_reason or "-" for s in self._samples])
        log.info("%s tenant=%s %s prompt=%d completion=%d cached=%d %.2fs", self.request_id, self.caller.tenant_id,
                 outcome, u.prompt_tokens, u.completion_tokens, u.cached_tokens, time.time() - self.arrival_time)


def _as_api_error(e: EngineError) -> APIError:
    if isinstance(e, RequestFailedError) and e.code == DEADLINE_EXCEEDED:
        return APIError(f"the request timed out: {e}", code="request_timeout", status_code=504)
    if isinstance(e, RequestFailedError):
        return InternalError(f"the engine failed this request: {e}", code="engine_request_error")
    if isinstance(e, EngineDeadError):
        return EngineUnavailable(f"the engine is unavailable: {e}", code="engine_unavailable")
    return EngineUnavailable(str(e), code="engine_unavailable")


def check_context(
    num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt_param: str, max_param: str
) -> None:
    """Prompt plus requested output must fit the model's context: a 400 that says the limits."""
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequest(
            f"the prompt has {num_prompt_tokens} tokens; this model's context is {max_model_len} tokens "
            f"and prompt + {max_param} must not exceed it",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if num_prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequest(
            f"prompt ({num_prompt_tokens} tokens) + {max_param} ({max_tokens}) = "
            f"{num_prompt_tokens + max_tokens} exceeds this model's context of {max_model_len} tokens",
            param=max_param,
            code="context_length_exceeded",
        )
