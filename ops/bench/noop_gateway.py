"""The real gateway app around a no-op engine, for `pageserve bench admission --gateway`.

    python -m ops.bench.noop_gateway PORT REDIS_URL PREFIX {on|off} [STEPS_JSON RECORD]

Serves the real app (`create_app`: routing, auth, body validation, the chat
template, SSE/JSON formatting, detokenization) on 127.0.0.1:PORT with uvicorn;
the engine answers every request at once with one token per sample, so what
is measured is the gateway itself. "off" runs without tenancy: no Redis at
all, any key is let in (a static key store, no quotas), so the two runs differ
by everything tenancy adds. "on" also times, inside this process, the first
RECORD authenticate+admit steps and settlements, and writes them to
STEPS_JSON (ms) at shutdown.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from gateway.tenancy import AuthContext, TenantStore, connect
from gateway.tenancy.admission import Admission, Settlement, Ticket
from shared.model_info import ModelInfo
from shared.protocol import AddRequest, Finished, Stats, TokenDelta, Usage

MODEL_INFO = ModelInfo(model_name="smollm2", max_model_len=2048, block_size=16, eos_token_id=2, num_blocks=4096)
TOKEN = 7042  # " Paris"


class NoopStream:
    """Each sample: one TokenDelta, then Finished("length")."""

    def __init__(self, request: AddRequest) -> None:
        self.request_id = request.request_id
        n_prompt = len(request.prompt_token_ids)
        self._items: list[TokenDelta | Finished] = []
        for i in range(request.sampling.n):
            self._items.append(TokenDelta(request.request_id, i, [TOKEN], n_prompt, 1, 0))
            self._items.append(Finished(request.request_id, i, "length", Usage(n_prompt, 1, 0)))

    @property
    def finished(self) -> bool:
        """As RequestStream.finished: nothing more will come."""
        return not self._items

    def __aiter__(self) -> NoopStream:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        if not self._items:
            raise StopAsyncIteration
        return self._items.pop(0)

    async def aclose(self) -> None:
        self._items.clear()


class NoopEngine:
    model_info = MODEL_INFO

    async def submit(self, request: AddRequest) -> NoopStream:
        return NoopStream(request)

    async def stats(self, timeout: float = 5.0) -> Stats:
        return Stats(0, 0, 0, MODEL_INFO.num_blocks, MODEL_INFO.num_blocks, 0, 0, 0, 0, 0, 0.0, 1)


class NoopSource:
    client = NoopEngine()


class AnyKey:
    """Tenancy off: every key is the same caller, and Redis is never asked."""

    CALLER = AuthContext(tenant_id="t_bench", tenant="bench", key_id="key_bench", tier="standard", priority=1,
                         weight=2.0, cache_salt="0" * 32)

    async def authenticate(self, plaintext: str) -> AuthContext | None:
        return self.CALLER

    async def ping(self) -> bool:
        return True


class TimedAdmission(Admission):
    """Admission that records how long each authenticate+admit and each settlement took (ms)."""

    def __init__(self, client: Redis, prefix: str, record: int) -> None:
        super().__init__(client, prefix)
        self.steps: dict[str, list[float]] = {"authenticate+admit": [], "settle": []}
        self.record = record

    def _note(self, step: str, start: float) -> None:
        if len(self.steps[step]) < self.record:
            self.steps[step].append((time.perf_counter() - start) * 1000)

    async def admit_key(self, plaintext: str, prompt_tokens: int, max_tokens: int | None,
                        model: str = "", weight: float = 1.0) -> tuple[AuthContext, Ticket] | None:
        start = time.perf_counter()
        try:
            return await super().admit_key(plaintext, prompt_tokens, max_tokens, model, weight)
        finally:
            self._note("authenticate+admit", start)

    async def settle_reservation(self, reservation_id: str, prompt_tokens: int, completion_tokens: int,
                                 cached_tokens: int = 0, error: bool = False) -> Settlement:
        start = time.perf_counter()
        try:
            return await super().settle_reservation(reservation_id, prompt_tokens, completion_tokens,
                                                    cached_tokens, error)
        finally:
            self._note("settle", start)


def main(argv: list[str]) -> int:
    import uvicorn

    port, redis_url, prefix, mode = int(argv[0]), argv[1], argv[2], argv[3]
    steps_path, record = (argv[4] or None, int(argv[5])) if len(argv) > 5 else (None, 0)
    config = GatewayConfig(redis_url=redis_url, redis_prefix=prefix, port=port)

    @contextlib.asynccontextmanager
    async def services(cfg: GatewayConfig) -> AsyncIterator[GatewayState]:
        prompts = await Prompts.load(cfg.model)
        if mode == "off":
            yield GatewayState(cfg, NoopSource(), prompts, AnyKey(), AnyKey())  # type: ignore[arg-type]
            return
        redis = connect(cfg.redis_url)
        store = TenantStore(redis, prefix=cfg.redis_prefix, actor="bench")
        admission = TimedAdmission(redis, cfg.redis_prefix, record)
        try:
            yield GatewayState(cfg, NoopSource(), prompts, store, store, admission)  # type: ignore[arg-type]
        finally:
            await admission.aclose()
            await redis.aclose()
            if steps_path:
                with open(steps_path, "w") as f:
                    json.dump(admission.steps, f)

    uvicorn.run(create_app(config, services), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
