"""The one record of the served model's facts: built once by the engine, carried to gateways in Ready.

    EngineCore (loads the model, sizes the KV cache, resolves sampling defaults)
      -> ModelInfo ─┬─ the engine server checks requests against it, announces it in Redis
                    └─ Ready(protocol_version, model=ModelInfo)  ->  every gateway validates with it

It holds what a gateway needs to validate and route requests; facts only the
engine process uses (the weights' folder and dtype, the CPU swap pool) stay on
the engine's core. On the wire its fields are Ready's fields after
protocol_version (shared/protocol.py), so the wire rule holds here too: fields
are only ever appended, each with a default. This module imports neither torch
nor engine/ nor gateway/.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingDefault:
    """One default sampling value: a SamplingParams field name and its value."""

    name: str
    value: float


@dataclass(frozen=True)
class AdapterInfo:
    """A LoRA adapter the engine serves on its base model (vLLM's /v1/models: `parent` is the base)."""

    name: str
    parent: str


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model and its KV cache, as gateways and the engine's admission see them."""

    model_name: str
    max_model_len: int
    """Prompt plus generated tokens may not exceed this."""
    block_size: int
    eos_token_id: int | None
    num_blocks: int
    """KV cache blocks in the device pool (Stats.num_free_blocks counts down from it)."""
    vocab_size: int = 0
    """Token ids must be below this (logit_bias is checked against it); 0: unknown (an older engine)."""
    default_sampling: tuple[SamplingDefault, ...] = ()
    """Sampling values for fields a request leaves out: the model's generation_config.json,
    overridden by the engine's --default-sampling flag (engine/worker/sampling_defaults.py).
    The gateway fills them in."""
    adapters: tuple[AdapterInfo, ...] = ()
    """LoRA adapters a request's `model` may name instead of model_name (--enable-lora --lora-modules)."""

    def sampling_defaults(self) -> dict[str, float]:
        """default_sampling as SamplingParams.with_defaults takes it."""
        return {d.name: d.value for d in self.default_sampling}
