"""A request's final sampling parameters and its output-token reservation: decided together, once.

    the body's sampling fields (GenerationSettings)  ┐
    the prompt's length                              ├─ decide_sampling() -> DecidedSampling(sampling, reserved)
    the engine's ModelInfo, the gateway's limits     ┘

`max_tokens` is the client's, else the room left in the context (chat) or the
configured completion default, capped by the room; the engine's announced
defaults fill the fields the body left out; then the one `SamplingParams` is
built, so none ever exists with a placeholder max_tokens. The reservation is
best_of (or n) x max_tokens, or that many x admission's cap for a max_tokens the client did not give
(a chat default can be the whole context). Raises InvalidRequest (400 naming the
body field) before any quota is touched. Knows nothing about HTTP or Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import InvalidRequest
from gateway.generation import check_context
from gateway.openai_format import Endpoint
from gateway.schemas import GenerationSettings
from shared.model_info import ModelInfo
from shared.sampling import SamplingError, SamplingParams


@dataclass(frozen=True)
class OutputLimits:
    """The gateway's own limits on a request's output."""

    completion_default_max_tokens: int
    """/v1/completions without max_tokens (OpenAI's default)."""
    reservation_cap: int | None
    """Admission's default_max_tokens: a defaulted max_tokens reserves at most this per sample; None: no quotas."""


@dataclass(frozen=True)
class DecidedSampling:
    sampling: SamplingParams
    """Final: what the engine runs."""
    reserved_output_tokens: int
    """What admission reserves against the tenant's token quota."""


def decide_sampling(endpoint: Endpoint, settings: GenerationSettings, num_prompt_tokens: int, prompt_param: str,
                    info: ModelInfo, limits: OutputLimits) -> DecidedSampling:
    given = settings.sampling_fields
    max_tokens = settings.max_tokens
    if max_tokens is None:
        max_tokens = max(_default_max_tokens(endpoint, num_prompt_tokens, info, limits), given.get("min_tokens", 0))
    try:
        sampling = SamplingParams(**given, max_tokens=max_tokens).with_defaults(info.sampling_defaults(),
                                                                               frozenset(given))
        if info.vocab_size:
            sampling.check_vocabulary(info.vocab_size)
    except SamplingError as e:
        param = settings.max_param if e.param == "max_tokens" else e.param
        raise InvalidRequest(str(e), param=param, code="invalid_value") from None
    check_context(num_prompt_tokens, max_tokens, info.max_model_len, prompt_param, settings.max_param)
    per_sample = max_tokens
    if settings.max_tokens is None and limits.reservation_cap is not None:
        per_sample = min(per_sample, limits.reservation_cap)
    return DecidedSampling(sampling, sampling.num_candidates * per_sample)  # best_of: every candidate generates


def _default_max_tokens(endpoint: Endpoint, num_prompt_tokens: int, info: ModelInfo, limits: OutputLimits) -> int:
    """The room left in the context and in the whole KV pool (the engine refuses a request that could
    never fit: a default must not make a valid request unservable); completions stop at their default."""
    limit = min(info.max_model_len, info.num_blocks * info.block_size)
    room = max(1, limit - num_prompt_tokens)
    return room if endpoint == "chat" else min(room, limits.completion_default_max_tokens)
