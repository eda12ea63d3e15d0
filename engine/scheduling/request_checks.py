"""Admission checks: a request that could never run, or could break a step, is refused up front.

The one place the engine decides whether a request is admissible (the server and
the offline `LLM` both reach it through `Scheduler.add_request`):

  * against the model: every token id that indexes a tensor (prompt, stop ids)
    inside the vocabulary;
  * against the wire and the sampler: integers inside int64, floats finite
    (`SamplingParams` checks its own ranges when it is built or decoded);
  * against the configuration: not empty, room left in the context, n within
    max_num_seqs, one sample's KV fits the whole pool.

Pure checks over the request; raising here is a bad request (`RequestRejected`,
a 4xx naming `param` for the client), never an engine failure. No torch, no zmq.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from shared.sampling import INT64_MAX, INT64_MIN, SamplingError


class RequestRejected(ValueError):
    """The request can never be served with this model and configuration (a 4xx for the client)."""

    def __init__(self, message: str, param: str = "") -> None:
        super().__init__(message)
        self.param = param
        """The request field at fault ("prompt", "stop_token_ids", ...); empty when none is."""


def validate_request(
    req: Request,
    config: SchedulerConfig,
    blocks_for: Callable[[int], int],
    num_device_blocks: int,
    vocab_size: int | None = None,
) -> None:
    """Raise RequestRejected unless the request can run; `vocab_size` None skips the id checks
    (a scheduler tested without a model)."""
    check_fields(req, vocab_size)
    check_capacity(req, config, blocks_for, num_device_blocks)


def check_fields(req: Request, vocab_size: int | None) -> None:
    """Token ids and numbers that reach tensors, heaps and the encoder."""
    if vocab_size is not None:
        _check_ids(req.prompt_token_ids, vocab_size, "prompt")
        _check_ids(req.sampling.stop_token_ids, vocab_size, "stop_token_ids")
        try:  # logit_bias ids: a bias on an id the model lacks would fail the whole step in the sampler
            req.sampling.check_vocabulary(vocab_size)
        except SamplingError as e:
            raise RequestRejected(str(e), e.param) from None
    if not (req.weight > 0 and math.isfinite(req.weight)):
        raise RequestRejected(f"the fair-share weight must be a positive finite number, got {req.weight}", "weight")
    if not INT64_MIN <= req.priority <= INT64_MAX:
        raise RequestRejected("priority must fit a signed 64-bit integer", "priority")
    if not math.isfinite(req.arrival_time):
        raise RequestRejected("arrival_time must be a finite number", "arrival_time")


def check_capacity(
    req: Request, config: SchedulerConfig, blocks_for: Callable[[int], int], num_device_blocks: int
) -> None:
    """Emptiness, context and KV room: the one place the engine checks a prompt's length."""
    if not req.prompt_token_ids:
        raise RequestRejected("the prompt is empty", "prompt")
    if req.num_prompt_tokens >= config.max_model_len:
        raise RequestRejected(
            f"the prompt has {req.num_prompt_tokens} tokens; the context is {config.max_model_len} "
            "and at least one must remain for the output",
            "prompt",
        )
    if req.sampling.num_candidates > config.max_num_seqs:
        param = "n" if req.sampling.best_of is None else "best_of"
        raise RequestRejected(f"{param}={req.sampling.num_candidates} exceeds max_num_seqs={config.max_num_seqs}",
                              param)
    if req.sampling.use_beam_search and req.grammar is not None:
        raise RequestRejected("beam search with a response format or tools is not supported", "use_beam_search")
    # KV is needed for every token but the last one sampled; one sample must fit alone.
    most = min(req.num_prompt_tokens + req.sampling.max_tokens, config.max_model_len) - 1
    need = blocks_for(most)
    if req.sampling.use_beam_search:  # the beams run together, sharing at least the prompt's full blocks
        shared = blocks_for(req.num_prompt_tokens) - 1
        need = shared + req.sampling.beam_width * (need - shared)
    if need > num_device_blocks:
        raise RequestRejected(f"the request may need {need} KV blocks; the cache has {num_device_blocks}",
                              "max_tokens")


def _check_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    # min/max over the list: one C loop each, cheap beside the prompt's forward pass.
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise RequestRejected(f"token id {bad} in {param} is outside the vocabulary [0, {vocab_size})", param)
