"""Admission checks: a request that could never run is refused up front with a clear message.

Pure checks over the request and the scheduler's configuration; raising here is a
bad request (4xx for the client), never an engine failure.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.request import Request
from engine.scheduling.config import SchedulerConfig


class RequestRejected(ValueError):
    """The request can never be served with this configuration (a 4xx for the client)."""


def validate_request(
    req: Request, config: SchedulerConfig, blocks_for: Callable[[int], int], num_device_blocks: int
) -> None:
    if not req.prompt_token_ids:
        raise RequestRejected("the prompt is empty")
    if req.num_prompt_tokens >= config.max_model_len:
        raise RequestRejected(
            f"the prompt has {req.num_prompt_tokens} tokens; the context is {config.max_model_len} "
            "and at least one must remain for the output"
        )
    if req.sampling.n > config.max_num_seqs:
        raise RequestRejected(f"n={req.sampling.n} exceeds max_num_seqs={config.max_num_seqs}")
    if not req.weight > 0:
        raise RequestRejected("the fair-share weight must be positive")
    # KV is needed for every token but the last one sampled; one sample must fit alone.
    most = min(req.num_prompt_tokens + req.sampling.max_tokens, config.max_model_len) - 1
    if blocks_for(most) > num_device_blocks:
        raise RequestRejected(
            f"the request may need {blocks_for(most)} KV blocks; the cache has {num_device_blocks}"
        )
