"""Sampling parameters: what the gateway asks for and the engine obeys.

Pure Python (no torch): the gateway builds these from an HTTP body, the wire
protocol carries them, the engine's sampler reads them. Validation lives here so
both sides reject the same inputs with the same message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    """0 means greedy."""
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

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
