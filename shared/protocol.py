"""The wire protocol between gateways and the engine: a handful of msgpack messages.

Every message is a frozen dataclass, encoded as one msgpack array

    [type_tag, field_1, field_2, ...]           fields in declaration order

Rules that keep old and new peers talking:
  * fields are only ever appended, each new one with a default;
  * a decoder ignores extra trailing fields (a newer peer) and fills missing
    trailing fields that have defaults (an older peer);
  * tags are never reused.

Decoding validates every field's type and raises `ProtocolError` with a message
naming the message type and field; it never raises anything else, so a garbage
frame can never crash the receiver. `SamplingParams` travels as a map (its own
`to_dict`), so fields appended there need no change here.

Who sends what:

    gateway (DEALER)                         engine (ROUTER)
    Hello(version, gateway_id)        ->
                                      <-     Ready(version, ModelInfo)  or Error
    AddRequest / Abort / GetStats     ->
                                      <-     StepOutputs (one per step per gateway),
                                             Stats, Error
    Bye                               ->     (the engine forgets the gateway, aborts its requests)
    LoadAdapter / UnloadAdapter       ->     (admin, issue 43: the gateway's admin route sends them)
                                      <-     ModelUpdate to every gateway when the adapters changed,
                                             then AdapterReply to the sender

This module imports neither torch nor engine/ nor gateway/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from shared.model_info import ModelInfo, SamplingDefault
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec
from shared.wire_codec import INLINE, Codec, ProtocolError

PROTOCOL_VERSION = 1
"""Bumped only for changes that appending fields cannot express."""

ErrorKind = Literal["request", "engine"]
SHUTTING_DOWN = "shutting_down"
"""Error.code of a request refused because the engine is stopping."""
REQUEST_REJECTED = "request_rejected"
"""Error.code of a request refused at admission: it can never run with this model (the client's fault)."""
DEADLINE_EXCEEDED = "deadline_exceeded"
"""Error.code of a request the engine aborted because it ran past the engine's request deadline."""
MODEL_NOT_FOUND = "model_not_found"
"""Error.code of a request naming an adapter the engine does not serve (unloaded since the gateway
last heard): the gateway answers 404 model_not_found, as for any unknown model."""
REQUEST_FAILED = "request_failed"
"""Error.code of a request that failed while it ran; its blocks are freed and the engine goes on."""
FinishReason = Literal["stop", "length", "abort"]


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Hello:
    """First message of a gateway: the engine answers Ready, or Error on a version mismatch."""

    TAG: ClassVar[int] = 1
    protocol_version: int
    gateway_id: str


@dataclass(frozen=True)
class Ready:
    """The engine's answer to Hello: the model's facts, which the gateway validates requests with."""

    TAG: ClassVar[int] = 2
    protocol_version: int
    model: ModelInfo = field(metadata=INLINE)
    """Inline: its fields follow protocol_version in the frame, as Ready's own did before it was one
    record (shared/model_info.py), so the bytes did not change; fields are appended to ModelInfo."""


@dataclass(frozen=True)
class AddRequest:
    TAG: ClassVar[int] = 3
    request_id: str
    """Unique among the sender's in-flight requests; outputs carry it back."""
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int = 0
    """Lower is more urgent."""
    tenant_id: str = ""
    arrival_time: float = 0.0
    """Gateway's time.time() at arrival (queueing fairness, latency accounting)."""
    weight: float = 1.0
    """The tenant's fair-share weight."""
    cache_salt: str = ""
    """Prefix-cache isolation: requests share cached blocks only with equal salts."""
    grammar: GrammarSpec | None = None
    """Structured output: the engine masks every sampled token to this grammar (None: free text)."""
    lora_name: str = ""
    """The LoRA adapter to run under (one of Ready's ModelInfo.adapters); "": the base model."""


@dataclass(frozen=True)
class Abort:
    """Stop these requests; unknown or finished ids are ignored (they race with finishing)."""

    TAG: ClassVar[int] = 4
    request_ids: list[str]


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability and the most likely alternatives (nested in TokenDelta),
    from the raw model output (vLLM V1's default): before temperature, penalties and bias."""

    logprob: float
    top_token_ids: list[int]
    """The request's `logprobs` most likely token ids, most likely first."""
    top_logprobs: list[float]


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one sample of one request in one step (nested in StepOutputs)."""

    TAG: ClassVar[int] = 10
    request_id: str
    index: int
    """Which of the request's n samples."""
    new_token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    """Cumulative, including new_token_ids."""
    num_cached_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per new token when the request asked for logprobs, else empty."""
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """With SamplingParams.prompt_logprobs, on the request's first delta (sample 0): one per prompt
    token after the first (the first has no logprob: nothing precedes it), else empty."""
    num_unreturned_tokens: int = 0
    """best_of > n: tokens generated by candidates that are not returned (usage counts them)."""


@dataclass(frozen=True)
class Usage:
    TAG: ClassVar[int] = 11
    prompt_tokens: int
    completion_tokens: int
    """Tokens generated by this sample."""
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""


@dataclass(frozen=True)
class Finished:
    """One sample of a request ended; it comes after that sample's last TokenDelta."""

    TAG: ClassVar[int] = 12
    request_id: str
    index: int
    reason: FinishReason
    usage: Usage
    queue_seconds: float | None = None
    """Seconds from the request's arrival at the engine to its first scheduling (the same for every
    sample; vllm:request_queue_time_seconds). None: never scheduled (aborted while queued), or an older engine."""


@dataclass(frozen=True)
class StepOutputs:
    """Everything one engine step produced for one gateway."""

    TAG: ClassVar[int] = 5
    deltas: list[TokenDelta]
    finished: list[Finished]
    """Applied after all deltas of the same message."""
    step: int = 0
    """The engine's step counter (diagnostics)."""


@dataclass(frozen=True)
class Error:
    """kind "request": that request is over, the engine goes on. kind "engine": the engine is gone."""

    TAG: ClassVar[int] = 6
    request_id: str | None
    kind: ErrorKind
    message: str
    code: str = ""
    """Machine-readable detail; "shutting_down": refused because the engine is stopping (retry elsewhere);
    "request_rejected": the request can never run here (a 4xx); "request_failed": it failed mid-run (a 500)."""
    param: str = ""
    """The request field at fault, when one is (OpenAI's error `param`)."""


@dataclass(frozen=True)
class GetStats:
    TAG: ClassVar[int] = 7


@dataclass(frozen=True)
class PriorityLoad:
    """Requests in flight at one priority level (nested in Stats)."""

    TAG: ClassVar[int] = 13
    priority: int
    queued: int
    """Accepted, no token produced yet (waiting, or in prefill)."""
    running: int
    """Producing tokens."""


@dataclass(frozen=True)
class TenantLoad:
    """One tenant's part of the engine (nested in Stats): the basis of its fair share."""

    TAG: ClassVar[int] = 14
    tenant_id: str
    in_flight: int
    generated_tokens: int
    """Since the engine started."""


@dataclass(frozen=True)
class Stats:
    TAG: ClassVar[int] = 8
    num_running: int
    num_waiting: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    """Since start."""
    num_steps: int
    num_finished: int
    """Requests finished since start (all reasons)."""
    num_aborted: int
    max_requests_per_step: int
    """Most requests that shared one step (the batching the engine achieved)."""
    mean_requests_per_step: float
    num_gateways: int
    step_seconds: float = 0.0
    """Total time inside the core's steps (model + scheduler) since start."""
    loop_seconds: float = 0.0
    """Total time of busy loop turns (steps plus message I/O); minus step_seconds: the server's overhead."""
    num_prompt_tokens: int = 0
    """Prompt tokens of requests that produced their first token, since start (vllm:prompt_tokens)."""
    num_generation_tokens: int = 0
    """Tokens generated (all samples), since start (vllm:generation_tokens)."""
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache, since start."""
    prefix_cache_hits: int = 0
    """Of those, tokens found (their KV was reused)."""
    num_swaps_out: int = 0
    """Preemptions that moved the victim's KV to the CPU pool (the rest of num_preemptions recomputed)."""
    num_recomputes: int = 0
    num_free_cpu_blocks: int = 0
    num_total_cpu_blocks: int = 0
    started_at: float = 0.0
    """The engine process's time.time() at start: a change means the engine was restarted."""
    by_priority: list[PriorityLoad] = field(default_factory=list)
    by_tenant: list[TenantLoad] = field(default_factory=list)
    """Tenants with requests in flight or tokens generated since start."""
    max_loras: int = 0
    """--max-loras: distinct adapters one step may run (0: LoRA not enabled)."""
    lora_running: list[str] = field(default_factory=list)
    """Adapter names of the running requests (vllm:lora_requests_info's running_lora_adapters)."""
    lora_waiting: list[str] = field(default_factory=list)
    """Adapter names of the queued and swapped requests (its waiting_lora_adapters)."""
    lora_loaded: int = 0
    """Adapter names a request may use now."""
    lora_resident: int = 0
    """Adapter loads whose weights are in memory (at most --max-cpu-loras, plus those requests hold)."""
    lora_evictions: int = 0
    """Adapter weights dropped from memory over --max-cpu-loras, since start."""
    lora_load_buckets: list[int] = field(default_factory=list)
    """Adapter reads from disk by duration: cumulative counts per LORA_LOAD_BUCKETS bound, then the total."""
    lora_load_seconds: float = 0.0
    """Their total seconds (the histogram's sum)."""


@dataclass(frozen=True)
class Bye:
    """A gateway leaving cleanly; its in-flight requests are aborted at once."""

    TAG: ClassVar[int] = 9
    reason: str = ""


@dataclass(frozen=True)
class LoadAdapter:
    """Admin (issue 43): load the LoRA adapter in `lora_path`, a PEFT folder on the engine's host, as
    `lora_name` (a name already loaded is reloaded under a new load id). Read off the engine's step loop;
    answered by AdapterReply once it serves requests, or with the reason it cannot."""

    TAG: ClassVar[int] = 15
    call_id: str
    """Unique among the sender's calls; the reply carries it back."""
    lora_name: str
    lora_path: str


@dataclass(frozen=True)
class UnloadAdapter:
    """Admin: new requests no longer find `lora_name`; those already admitted finish on its weights."""

    TAG: ClassVar[int] = 16
    call_id: str
    lora_name: str


@dataclass(frozen=True)
class AdapterReply:
    """The answer to LoadAdapter or UnloadAdapter."""

    TAG: ClassVar[int] = 17
    call_id: str
    error: str = ""
    """Why it failed, naming the file, tensor or limit; "": done."""
    code: str = ""
    """With an error: REQUEST_REJECTED (a bad adapter or request: a 400) or MODEL_NOT_FOUND (no such adapter)."""
    load_id: int = 0
    """The new load's id (never reused: a reload gets a new one, so no stale prefix-cache block); 0 for unload."""


@dataclass(frozen=True)
class ModelUpdate:
    """The engine's model facts changed (an adapter loaded or unloaded): sent to every connected gateway,
    which serves the new catalog from then on (before the AdapterReply that caused it)."""

    TAG: ClassVar[int] = 18
    model: ModelInfo


LORA_LOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of Stats.lora_load_buckets: the load-latency histogram (the issue's bar: 0.1 s)."""

Message = (Hello | Ready | AddRequest | Abort | StepOutputs | Error | GetStats | Stats | Bye | LoadAdapter
           | UnloadAdapter | AdapterReply | ModelUpdate)
_TOP_LEVEL: tuple[type, ...] = (Hello, Ready, AddRequest, Abort, StepOutputs, Error, GetStats, Stats, Bye,
                                LoadAdapter, UnloadAdapter, AdapterReply, ModelUpdate)
_CODEC = Codec(_TOP_LEVEL)

__all__ = [
    "DEADLINE_EXCEEDED", "PROTOCOL_VERSION", "REQUEST_FAILED", "REQUEST_REJECTED", "SHUTTING_DOWN", "ErrorKind",
    "FinishReason", "Message", "ProtocolError", "decode", "encode",
    "Hello", "Ready", "ModelInfo", "SamplingDefault", "AddRequest", "Abort", "StepOutputs", "TokenDelta", "TokenLogprob",
    "Finished", "Usage", "Error", "GetStats", "Stats", "PriorityLoad", "TenantLoad", "Bye",
    "LoadAdapter", "UnloadAdapter", "AdapterReply", "ModelUpdate", "LORA_LOAD_BUCKETS", "MODEL_NOT_FOUND",
]


def encode(msg: Message) -> bytes:
    """One frame: msgpack array [tag, *fields]."""
    return _CODEC.encode(msg)


def decode(frame: bytes) -> Message:
    """Parse one frame; raises ProtocolError (only) when it is not a valid message."""
    return _CODEC.decode(frame)  # type: ignore[no-any-return]
