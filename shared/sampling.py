"""Sampling parameters: what the gateway asks for and the engine obeys.

Pure Python (no torch): the gateway builds these from an HTTP body, the wire
protocol carries them, the engine's sampler reads them. Validation lives here so
both sides reject the same inputs with the same message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

MAX_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's top_logprobs limit)."""
DEFAULTABLE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""Fields a server-wide default may fill: those vLLM reads from generation_config.json."""
MAX_LOGIT_BIAS = 300
"""Most entries in one logit_bias map (OpenAI's own limit)."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every integer here travels as a msgpack int64 and ends in torch or Python arithmetic that holds it."""
UINT64_MAX = 2**64 - 1
"""A seed may use the whole unsigned range too (msgpack and torch.Generator.manual_seed hold it)."""
MAX_STOP_TOKEN_IDS = 64
"""Each is compared with every sampled token and masked while min_tokens holds: keep the list short."""
MAX_BAD_WORDS = 128
"""Token sequences in one request's bad_words (each word is tokenized with and without a leading space)."""
MAX_BAD_WORD_TOKENS = 32
"""Tokens in one bad word: its prefix is compared with the output's tail every step."""
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
    presence_penalty: float = 0.0
    """OpenAI's: subtracted once from the logit of every token already generated (-2 to 2)."""
    frequency_penalty: float = 0.0
    """OpenAI's: subtracted from a token's logit once per time it was generated (-2 to 2)."""
    repetition_penalty: float = 1.0
    """transformers'/vLLM's multiplicative one over prompt and output tokens: a positive logit
    is divided by it, a negative one multiplied (1 is off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely one's (0 is off)."""
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    """(token id, bias in [-100, 100]) pairs added to the logits; ids are checked against the
    vocabulary where it is known (the gateway's plan, the engine's admission)."""
    logprobs: int | None = None
    """None: no log probabilities. k >= 0: the sampled token's and the k most likely tokens'
    (at most MAX_LOGPROBS), of the raw model output (vLLM V1's default `raw_logprobs`)."""
    allowed_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """vLLM's: only these ids may be sampled (every other logit -> -inf). Empty: no restriction."""
    bad_words_token_ids: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    """vLLM's bad_words, tokenized by the gateway: the last id of each sequence is banned at a step
    whose previous output ids end with the sequence's other ids (a one-id sequence: always banned)."""
    prompt_logprobs: int | None = None
    """None: none. k >= 0: each prompt token's logprob (the first has none) and the k most likely
    tokens at its position, from the prompt step's own logits (raw distribution, as `logprobs`)."""
    best_of: int | None = None
    """Candidates generated (None: n); the n with the highest cumulative log probability are
    returned. With beam search: the beam width."""
    use_beam_search: bool = False
    """vLLM's: keep the `best_of or n` most likely continuations every step (greedy only);
    engine/scheduling/beam_group.py."""
    length_penalty: float = 1.0
    """Beam search: a finished beam scores sum(logprobs) / len**length_penalty (len: generated tokens)."""
    early_stopping: bool | str = False
    """Beam search (transformers' rule): True stops once `width` beams finished; False stops when a
    heuristic says no running beam can do better; "never" when none can at any length."""

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
        self._check_penalties()
        self._check_candidates()
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not (isinstance(k, int) and 0 <= k <= MAX_LOGPROBS):
                raise SamplingError(name, f"{name} must be an integer between 0 and {MAX_LOGPROBS}")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SamplingError(name, f"{name} must be between -2 and 2")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise SamplingError("repetition_penalty", "repetition_penalty must be in (0, 2]")
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingError("min_p", "min_p must be between 0 and 1")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise SamplingError("logit_bias", f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens")
        for token_id, bias in self.logit_bias:
            if not isinstance(token_id, int) or token_id < 0:
                raise SamplingError("logit_bias", f"logit_bias keys must be token ids (non-negative), got {token_id}")
            if not -100.0 <= bias <= 100.0:
                raise SamplingError("logit_bias", f"logit_bias values must be between -100 and 100, got {bias}")

    def _check_candidates(self) -> None:
        """best_of and beam search, with vLLM's (V0) rules for what combines with them."""
        if self.best_of is not None and not (isinstance(self.best_of, int) and self.n <= self.best_of <= 16):
            raise SamplingError("best_of", "best_of must be an integer between n and 16")
        if self.early_stopping not in (True, False, "never"):
            raise SamplingError("early_stopping", 'early_stopping must be true, false or "never"')
        if not -10.0 <= self.length_penalty <= 10.0:
            raise SamplingError("length_penalty", "length_penalty must be between -10 and 10")
        if self.prompt_logprobs is not None and (self.use_beam_search or self.num_candidates > self.n):
            # Such groups stream nothing until the end: the prompt step's delta that carries the
            # prompt logprobs (engine/core.py's with_prompt_logprobs) never exists.
            raise SamplingError("prompt_logprobs", "prompt_logprobs is not supported with best_of > n or beam search")
        if not self.use_beam_search:
            if self.length_penalty != 1.0:
                raise SamplingError("length_penalty", "length_penalty is used only with use_beam_search")
            if self.early_stopping is not False:
                raise SamplingError("early_stopping", "early_stopping is used only with use_beam_search")
            return
        if not self.greedy:
            raise SamplingError("temperature", "beam search needs temperature 0")
        # The beams rank the raw distribution (engine/worker/logprobs.py): nothing that reshapes it,
        # and no min_tokens (it would need stop tokens masked among the candidates).
        for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("logprobs", None), ("min_tokens", 0),
                          ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
            if getattr(self, name) != off:
                raise SamplingError(name, f"{name} is not supported with beam search")
        for name in ("logit_bias", "allowed_token_ids", "bad_words_token_ids"):
            if getattr(self, name):
                param = "bad_words" if name == "bad_words_token_ids" else name
                raise SamplingError(param, f"{param} is not supported with beam search")

    @property
    def num_candidates(self) -> int:
        """Sequences generated for the request: best_of (or n); with beam search, the beam width."""
        return self.best_of or self.n

    @property
    def beam_width(self) -> int:
        """0 unless beam search: then the beams kept each step."""
        return self.num_candidates if self.use_beam_search else 0

    def check_vocabulary(self, vocab_size: int) -> None:
        """Token ids this request names must exist in the model's vocabulary."""
        named = (("logit_bias", [t for t, _ in self.logit_bias]), ("allowed_token_ids", self.allowed_token_ids),
                 ("bad_words", [t for word in self.bad_words_token_ids for t in word]))
        for param, ids in named:
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise SamplingError(param, f"{param} names token id {bad[0]}; the vocabulary has "
                                           f"{vocab_size} tokens (ids 0 to {vocab_size - 1})")

    @property
    def uses_penalties(self) -> bool:
        """Any of presence, frequency or repetition penalty is active (the sampler needs past tokens)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def _check_wire_ints(self) -> None:
        """Integers the wire (msgpack int64) and the sampler can hold; token ids non-negative.
        Whether a stop id is inside the vocabulary needs the model: engine/scheduling/request_checks.py."""
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
        if any(type(t) is not int or not 0 <= t <= INT64_MAX for t in self.allowed_token_ids):
            raise SamplingError("allowed_token_ids", "allowed_token_ids must be non-negative integers")
        words = self.bad_words_token_ids
        if len(words) > MAX_BAD_WORDS or any(not w or len(w) > MAX_BAD_WORD_TOKENS for w in words):
            raise SamplingError("bad_words", f"at most {MAX_BAD_WORDS} bad words of 1 to {MAX_BAD_WORD_TOKENS} tokens")
        if any(type(t) is not int or not 0 <= t <= INT64_MAX for w in words for t in w):
            raise SamplingError("bad_words", "bad_words token ids must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def with_defaults(self, defaults: dict[str, float], given: frozenset[str]) -> SamplingParams:
        """These params with each default (field name -> value, announced by the engine) filled in
        where the request did not give the field itself: a request's own values always win."""
        fill: dict[str, Any] = {k: v for k, v in defaults.items() if k not in given and k in DEFAULTABLE_FIELDS}
        if "top_k" in fill:
            fill["top_k"] = int(fill["top_k"])
        return replace(self, **fill) if fill else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["logit_bias"] = [[t, b] for t, b in self.logit_bias]
        d["allowed_token_ids"] = list(self.allowed_token_ids)
        d["bad_words_token_ids"] = [list(w) for w in self.bad_words_token_ids]
        # Fields added after the first protocol travel only when set: a request that uses none
        # encodes to the same bytes as before (older peers, golden bytes, smaller frames).
        for name in _OPTIONAL_ON_WIRE:
            if d[name] == _DEFAULTS[name]:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "stop_token_ids" in known:
            known["stop_token_ids"] = tuple(known["stop_token_ids"])
        if "logit_bias" in known:
            known["logit_bias"] = tuple((t, b) for t, b in known["logit_bias"])
        if "allowed_token_ids" in known:
            known["allowed_token_ids"] = tuple(known["allowed_token_ids"])
        if "bad_words_token_ids" in known:
            known["bad_words_token_ids"] = tuple(tuple(w) for w in known["bad_words_token_ids"])
        return cls(**known)


_DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
    "logit_bias": [], "logprobs": None, "allowed_token_ids": [], "bad_words_token_ids": [], "prompt_logprobs": None,
    "best_of": None, "use_beam_search": False, "length_penalty": 1.0, "early_stopping": False,
}
"""The wire form of the fields `to_dict` leaves out at these values."""
_OPTIONAL_ON_WIRE = tuple(_DEFAULTS)
