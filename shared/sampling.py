"""Sampling parameters: what the gateway asks for and the engine obeys.

Pure Python (no torch): the gateway builds these from an HTTP body, the wire
protocol carries them, the engine's sampler reads them. Validation lives here so
both sides reject the same inputs with the same message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every integer here travels as a msgpack int64 and ends in torch or Python arithmetic that holds it."""
UINT64_MAX = 2**64 - 1
"""A seed may use the whole unsigned range too (msgpack and torch.Generator.manual_seed hold it)."""
MAX_STOP_TOKEN_IDS = 64
"""Each is compared with every sampled token and masked while min_tokens holds: keep the list short."""
GREEDY_BELOW = 1e-5
"""Temperatures under this sample greedily (vLLM's rule): logits / 1e-300 overflow to inf and NaN."""


class SamplingError(ValueError):
    """A sampling parameter is out of range; `param` names it (OpenAI error shape)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Number of independent samples that share the prompt."""
    temperature: float = 1.0
    """0 (or anything below GREEDY_BELOW) means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    seed: int | None = None
    """Same seed, same prompt, same output."""
    max_tokens: int = 16
    min_tokens: int = 0
    """EOS and stop token ids are masked until this many tokens were generated."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self._check_ranges()
        self._check_wire_ints()

    def _check_ranges(self) -> None:
        if not isinstance(self.n, int) or not 1 <= self.n <= 16:
            raise SamplingError("n", "n must be an integer between 1 and 16")
        if not 0.0 <= self.temperature <= 2.0:
            raise SamplingError("temperature", "temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError("top_p", "top_p must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError("top_k", "top_k must be a non-negative integer (0 disables it)")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingError("max_tokens", "max_tokens must be a positive integer")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingError("min_tokens", "min_tokens must be between 0 and max_tokens")
        if self.seed is not None and not isinstance(self.seed, int):
            raise SamplingError("seed", "seed must be an integer")

    def _check_wire_ints(self) -> None:
        """Integers the wire (msgpack int64) and the sampler can hold; token ids non-negative.
        Whether a stop id is inside the vocabulary needs the model: engine/request_checks.py."""
        for name in ("top_k", "max_tokens", "min_tokens"):
            if not INT64_MIN <= getattr(self, name) <= INT64_MAX:
                raise SamplingError(name, f"{name} must fit a signed 64-bit integer")
        if self.seed is not None and not INT64_MIN <= self.seed <= UINT64_MAX:
            raise SamplingError("seed", f"seed must be between {INT64_MIN} and {UINT64_MAX}")
        ids = self.stop_token_ids
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise SamplingError("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed")
        if any(type(t) is not int or not 0 <= t <= INT64_MAX for t in ids):
            raise SamplingError("stop_token_ids", "stop_token_ids must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "stop_token_ids" in known:
            known["stop_token_ids"] = tuple(known["stop_token_ids"])
        return cls(**known)
