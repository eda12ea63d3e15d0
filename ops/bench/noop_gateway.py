"""The real gateway app around a no-op engine, for `pageserve bench admission --gateway`.

    python -m ops.bench.noop_gateway PORT REDIS_URL PREFIX {on|off}

Serves the real app (`create_app`: routing, auth, body validation, the chat
template, SSE/JSON formatting, detokenization) on 127.0.0.1:PORT with uvicorn;
the engine answers every request at once with one token per sample, so what
is measured is the gateway itself. "off" builds the state without quota
admission, so the two runs differ only by admission + settlement.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from gateway.tenancy import TenantStore, connect
from gateway.tenancy.admission import Admission
from shared.protocol import PROTOCOL_VERSION, AddRequest, Finished, Ready, Stats, TokenDelta, Usage

READY = Ready(protocol_version=PROTOCOL_VERSION, model_name="smollm2", max_model_len=2048, block_size=16,
              eos_token_id=2, num_blocks=4096)
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
    model_info = READY

    async def submit(self, request: AddRequest) -> NoopStream:
        return NoopStream(request)

    async def stats(self, timeout: float = 5.0) -> Stats:
        return Stats(0, 0, 0, READY.num_blocks, READY.num_blocks, 0, 0, 0, 0, 0, 0.0, 1)


class NoopSource:
    client = NoopEngine()


def main(argv: list[str]) -> int:
    import uvicorn

    port, redis_url, prefix, mode = int(argv[0]), argv[1], argv[2], argv[3]
    config = GatewayConfig(redis_url=redis_url, redis_prefix=prefix, port=port)

    @contextlib.asynccontextmanager
    async def services(cfg: GatewayConfig) -> AsyncIterator[GatewayState]:
        prompts = await Prompts.load(cfg.model)
        redis = connect(cfg.redis_url, max_connections=64)
        store = TenantStore(redis, prefix=cfg.redis_prefix, actor="bench")
        admission = Admission(redis, prefix=cfg.redis_prefix) if mode == "on" else None
        try:
            yield GatewayState(cfg, NoopSource(), prompts, store, store, admission)  # type: ignore[arg-type]
        finally:
            if admission is not None:
                await admission.aclose()
            await redis.aclose()

    uvicorn.run(create_app(config, services), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
