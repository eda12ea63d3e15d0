"""A core with no model: one token per running request per step, "length" at max_tokens.

It implements the methods `engine.serving.server.CoreLike` names with the same meaning (deltas
carry cumulative counts), so the server, the gateway and the wire can be measured
(`pageserve bench streaming`) and tested (tests/engine/serving/fake_core.py builds on it) without
loading a model or touching a KV cache. Block counts are what the requests would hold.
"""

from __future__ import annotations

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

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        out = []
        for rid in request_ids:
            if (r := self.requests.pop(rid, None)) is not None:
                out.append(RequestDelta(rid, [], r.num_prompt_tokens, r.num_output_tokens, 0, "abort"))
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestDelta]:
        out = []
        for r in list(self.requests.values()):
            r.output_token_ids.append(self.token_ids[r.num_output_tokens % len(self.token_ids)])
            done = r.num_output_tokens >= r.sampling.max_tokens
            out.append(RequestDelta(r.request_id, [r.output_token_ids[-1]], r.num_prompt_tokens,
                                    r.num_output_tokens, 0, "length" if done else None))
            if done:
                del self.requests[r.request_id]
        return out

    def counts(self) -> CoreCounts:
        used = sum(-(-r.num_tokens // self.block_size) for r in self.requests.values())
        return CoreCounts(len(self.requests), 0, 0, self.num_blocks - used, self.num_blocks, 0)
