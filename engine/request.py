"""One generation request as the engine sees it: token ids in, token ids out.

The request owns its state (token ids, how many are computed, its block table,
status, priority, arrival time). Only the scheduler changes a request's status,
through `Request.transition`, so every state change happens in one place.
The engine knows nothing about text: no tokenizer is imported here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shared.sampling import SamplingParams
from shared.structured import GrammarSpec


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no blocks
    RUNNING = "running"  # holds device blocks, scheduled each step
    SWAPPED = "swapped"  # preempted: its KV blocks live in the CPU pool
    FINISHED_STOPPED = "stop"  # EOS or a stop token id
    FINISHED_LENGTH = "length"  # max_tokens or the model's context reached
    FINISHED_ABORTED = "abort"  # client went away, or the engine shut down

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float
    priority: int = 0
    """Lower is more urgent (vLLM's convention)."""
    tenant_id: str = ""
    weight: float = 1.0
    """Fair-share weight of the tenant among requests of the same priority."""
    cache_salt: str = ""
    """Salts prefix-cache hashes so that tenants never share cached blocks."""
    eos_token_id: int | None = None
    grammar: GrammarSpec | None = None
    """Structured output: every sampled token obeys this grammar (engine/worker/structured_outputs.py)."""
    lora_name: str = ""
    """The LoRA adapter the client asked for by name ("": the base model)."""
    lora_id: int = 0
    """The adapter load it runs under, resolved once at admission (EngineCore.add_request): a reload of
    the name never changes it. 0: the base model."""

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    """Tokens whose KV is in the cache; the scheduler moves this toward num_tokens."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (reported as usage)."""
    block_ids: list[int] = field(default_factory=list)
    """This request's block table: logical block i lives in physical block block_ids[i]."""
    status: RequestStatus = RequestStatus.WAITING

    @property
    def adapter_key(self) -> str:
        """The adapter's part of every block hash: name and load, so that no KV block computed under one
        adapter (or an earlier load of the same name) is reused under another; "" for the base model."""
        return f"{self.lora_name}#{self.lora_id}" if self.lora_id else ""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def transition(self, new: RequestStatus) -> None:
        assert not self.status.finished, f"{self.request_id}: {self.status} is final"
        self.status = new
