"""The engine alone: the same timed request as openai_client.py, sent over ZeroMQ without the gateway.

    async with EngineDirect("tcp://127.0.0.1:5555") as direct:
        timing = await direct.send(index, request, t0)

Uses the gateway's own EngineClient (no HTTP, no tokenizer, no tenancy), so the
difference between this and a run through the gateway at the same arrival times
is what the gateway adds: HTTP, auth and quota admission, detokenization and SSE.
TTFT is stamped at the first delta carrying a token, ITL between deltas.
"""

from __future__ import annotations

import itertools
import time
from types import TracebackType

from gateway.engine_client import EngineClient, EngineError
from ops.bench.serve_stats import RequestTiming
from ops.bench.workloads import WorkloadRequest
from shared.protocol import AddRequest, TokenDelta
from shared.sampling import SamplingParams


class EngineDirect:
    def __init__(self, address: str) -> None:
        self.client = EngineClient(address, handshake_timeout=30)
        self._ids = itertools.count()

    async def __aenter__(self) -> EngineDirect:
        await self.client.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.client.close()

    async def send(self, index: int, req: WorkloadRequest, t0: float) -> RequestTiming:
        start = time.perf_counter() - t0
        params = SamplingParams(temperature=0.0, max_tokens=req.output_len, ignore_eos=True)
        add = AddRequest(f"bench-direct-{next(self._ids)}", list(req.prompt), params, tenant_id=req.tenant,
                         arrival_time=time.time())
        sent = time.perf_counter()
        stamps: list[float] = []
        produced = 0
        try:
            stream = await self.client.submit(add)
            async with stream:
                async for item in stream:
                    if isinstance(item, TokenDelta) and item.new_token_ids:
                        stamps.append(time.perf_counter())
                        produced = item.num_output_tokens
        except EngineError as e:
            return RequestTiming(index, req.tenant, start, len(req.prompt), error=type(e).__name__)
        end = time.perf_counter()
        if not stamps or produced < req.output_len:
            return RequestTiming(index, req.tenant, start, len(req.prompt), produced,
                                 error=f"incomplete: {produced}/{req.output_len} tokens")
        return RequestTiming(index, req.tenant, start, len(req.prompt), produced, stamps[0] - sent, end - sent,
                             tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False)))
