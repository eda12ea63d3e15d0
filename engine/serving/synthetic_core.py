"""A core with no model: one token per running request per step, "length" at max_tokens.

Every request is scheduled at the first step after it arrived: that wait is its queue time.

It implements the methods `engine.serving.server.CoreLike` names with the same meaning (deltas
carry cumulative counts), so the server, the gateway and the wire can be measured
(`pageserve bench streaming`) and tested (tests/engine/serving/fake_core.py builds on it) without
loading a model or touching a KV cache. Block counts are what the requests would hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from engine.outputs import RequestDelta
from engine.request import Request
from engine.serving.step_stats import CoreCounts


class SyntheticCore:
    def __init__(self, token_ids: Sequence[int], num_blocks: int, block_size: int) -> None:
        self.token_ids = list(token_ids)
        """Emitted in turn, cycling: request i's k-th output is token_ids[k % len]."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self.requests: dict[str, Request] = {}
        self._added_at: dict[str, float] = {}
        """time.monotonic() at add, until the request's first step."""

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self._added_at[request.request_id] = time.monotonic()

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        out = []
        for rid in request_ids:
            self._added_at.pop(rid, None)
            if (r := self.requests.pop(rid, None)) is not None:
                out.append(RequestDelta(rid, [], r.num_prompt_tokens, r.num_output_tokens, 0, "abort"))
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestDelta]:
        out, now = [], time.monotonic()
        for r in list(self.requests.values()):
            r.output_token_ids.append(self.token_ids[r.num_output_tokens % len(self.token_ids)])
            done = r.num_output_tokens >= r.sampling.max_tokens
            added_at = self._added_at.pop(r.request_id, None)
            out.append(RequestDelta(r.request_id, [r.output_token_ids[-1]], r.num_prompt_tokens,
                                    r.num_output_tokens, 0, "length" if done else None,
                                    queue_seconds=None if added_at is None else now - added_at))
            if done:
                del self.requests[r.request_id]
        return out

    def counts(self) -> CoreCounts:
        used = sum(-(-r.num_tokens // self.block_size) for r in self.requests.values())
        return CoreCounts(len(self.requests), 0, 0, self.num_blocks - used, self.num_blocks, 0)
