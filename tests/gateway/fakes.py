"""A scripted stand-in for `EngineClient`, for HTTP-shape unit tests only.

Each submitted request plays a script: per sample, a list of token ids sent one
per step, then a Finished with the scripted reason; `hang=True` keeps the
stream open after the tokens until it is aborted (disconnect tests). Aborts are
recorded so tests can assert the engine was told. The e2e suite uses the real
engine process instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.engine_client import EngineDeadError
from shared.model_info import ModelInfo
from shared.protocol import AddRequest, Finished, Stats, TokenDelta, TokenLogprob, Usage

MODEL_INFO = ModelInfo(model_name="smollm2", max_model_len=256, block_size=16, eos_token_id=2, num_blocks=64,
                       vocab_size=49152)


def _logprobs(request: AddRequest, token: int) -> list[TokenLogprob]:
    """Made-up but well-formed logprobs when asked: the token itself best, then the next ids."""
    k = request.sampling.logprobs
    if k is None:
        return []
    return [TokenLogprob(-0.25, [token + i for i in range(k)], [-0.25 - i for i in range(k)])]


def _prompt_logprobs(request: AddRequest) -> list[TokenLogprob]:
    """Made-up prompt logprobs when asked: token i of the prompt gets -i/100, its own id the best."""
    k = request.sampling.prompt_logprobs
    if k is None:
        return []
    return [TokenLogprob(-i / 100, [t] + [t + 1 + j for j in range(k - 1)] if k else [], [-i / 100] * k)
            for i, t in enumerate(request.prompt_token_ids[1:], start=1)]


@dataclass
class Script:
    samples: list[list[int]]
    """Token ids per sample, sent one token per step."""
    reason: str = "length"
    hang: bool = False
    """Never finish: the stream waits for an abort after the tokens."""
    fail: Exception | None = None
    """Raised from the iterator after the tokens (an engine error mid-stream)."""
    queue_seconds: float | None = None
    """The engine's queue time every Finished reports (None: as an older engine, none)."""
    unreturned: int = 0
    """best_of: tokens of candidates not returned, carried by choice 0's first delta."""


class FakeStream:
    def __init__(self, engine: FakeEngine, request: AddRequest, script: Script) -> None:
        self.request_id = request.request_id
        self._engine = engine
        self._queue: asyncio.Queue[TokenDelta | Finished | Exception] = asyncio.Queue()
        self._remaining = request.sampling.n
        self._task = asyncio.create_task(self._play(request, script))

    async def _play(self, request: AddRequest, script: Script) -> None:
        n_prompt = len(request.prompt_token_ids)
        longest = max(len(s) for s in script.samples)
        for step in range(longest):
            await asyncio.sleep(0.001)
            for index, tokens in enumerate(script.samples):
                if step < len(tokens):
                    first = step == 0 and index == 0
                    self._queue.put_nowait(TokenDelta(request.request_id, index, [tokens[step]], n_prompt,
                                                      step + 1, 0, _logprobs(request, tokens[step]),
                                                      _prompt_logprobs(request) if first else [],
                                                      script.unreturned if first else 0))
        if script.fail is not None:
            self._queue.put_nowait(script.fail)
            return
        if script.hang:
            await asyncio.Event().wait()
        for index, tokens in enumerate(script.samples):
            self._queue.put_nowait(Finished(request.request_id, index, script.reason,  # type: ignore[arg-type]
                                            Usage(n_prompt, len(tokens), 0), script.queue_seconds))

    @property
    def finished(self) -> bool:
        return self._remaining == 0

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        if self._remaining == 0:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self._remaining = 0
            raise item
        if isinstance(item, Finished):
            self._remaining -= 1
        return item

    async def aclose(self) -> None:
        if self._remaining > 0:
            self._engine.aborted.append(self.request_id)
        self._remaining = 0
        self._task.cancel()


@dataclass
class FakeEngine:
    script: Callable[[AddRequest], Script]
    model_info: ModelInfo = MODEL_INFO
    dead: bool = False
    submitted: list[AddRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    async def submit(self, request: AddRequest) -> FakeStream:
        if self.dead:
            raise EngineDeadError("lost the connection to the engine")
        self.submitted.append(request)
        return FakeStream(self, request, self.script(request))

    async def stats(self, timeout: float = 5.0) -> Stats:
        return Stats(0, 0, 0, 64, 64, 0, 0, 0, len(self.aborted), 0, 0.0, 1)


@dataclass
class FakeEngineSource:
    engine: FakeEngine

    @property
    def client(self) -> FakeEngine | None:
        return None if self.engine.dead else self.engine

    @property
    def progressing(self) -> bool:
        return not self.engine.dead

    latest_stats = None
    last_failure = ""

    def fail_open(self, reason: str) -> None:
        self.engine.dead = True
