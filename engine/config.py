"""The engine's configuration: frozen dataclasses, one per component, built once at start-up.

    EngineConfig
      ├─ model: ModelConfig          which weights, which dtype, how long a sequence may be
      ├─ cache: CacheConfig          KV block size and the memory budgets of both pools
      ├─ scheduler: SchedulerConfig  (engine/scheduling/config.py, the scheduler's own knobs)
      ├─ lora: LoraConfig            adapters on the base model, and their limits
      ├─ attention_backend           "auto" | "torch" | "triton"
      └─ tensor_parallel_size        ranks holding a shard of every layer (engine/worker/parallel/)

Nothing here is ever written after construction. What start-up derives from
these values (how many KV blocks fit in the budget, the model's real context
length) lives in `CacheLayout` (engine/worker/kv_cache.py) and `ModelInfo`
(shared/model_info.py, built by engine/core.py), never back in a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.scheduling.config import SchedulerConfig

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")

GiB = 1 << 30
MiB = 1 << 20


class ConfigError(ValueError):
    """A configuration value is out of range (a start-up error, not a request error)."""


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2"
    """Model spec for `shared.model_store.resolve_model`: a short name or a local HF folder."""
    dtype: DType = "auto"
    """Weights, activations and KV cache dtype; "auto" is decided at load (engine/worker/model_loader.py
    `resolve_dtype`: bfloat16 on a GPU or a CPU with bfloat16 hardware, float32 elsewhere)."""
    max_model_len: int | None = None
    """Longest prompt + output; None takes the model's max_position_embeddings."""
    device: str = "cpu"
    """Where the weights and the device KV pool live ("cpu" or "cuda")."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("max_model_len must be at least 2")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV block: the unit of allocation (waste per request < one block)."""
    kv_cache_memory: int = 2 * GiB
    """Bytes of the device KV pool (K and V of every layer); the block count is derived from it."""
    swap_space: int = 512 * MiB
    """Bytes of the CPU pool that preempted requests are swapped out to (0 disables swapping)."""
    num_device_blocks: int | None = None
    """Override the derived device block count (tests force tiny budgets with it)."""
    num_cpu_blocks: int | None = None
    """Override the derived CPU block count."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size must be positive")
        if self.kv_cache_memory < 0 or self.swap_space < 0:
            raise ConfigError("memory budgets must be non-negative")
        if self.num_device_blocks is not None and self.num_device_blocks < 1:
            raise ConfigError("num_device_blocks must be positive")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ConfigError("num_cpu_blocks must be non-negative")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters on the base model (engine/worker/lora/): --enable-lora and its limits."""

    enabled: bool = False
    """--enable-lora: requests may name an adapter; off, no adapter code runs at all."""
    modules: tuple[tuple[str, str], ...] = ()
    """--lora-modules NAME=PATH ...: adapters loaded at start-up (PEFT folders)."""
    max_loras: int = 4
    """--max-loras: distinct adapters in one step (the base model not counted)."""
    max_lora_rank: int = 64
    """--max-lora-rank: the largest rank an adapter may have."""
    max_cpu_loras: int = 32
    """--max-cpu-loras: adapters whose weights stay in memory; the rest are read again from disk on use."""

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ConfigError("--max-loras and --max-lora-rank must be at least 1")
        if self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras ({self.max_loras})")
        if self.modules and not self.enabled:
            raise ConfigError("--lora-modules needs --enable-lora")
        names = [name for name, _ in self.modules]
        if len(set(names)) != len(names):
            raise ConfigError(f"--lora-modules names an adapter twice: {names}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model, in which dtype."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """The paged KV cache."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Continuous batching: token budget, seats, priorities, preemption."""
    attention_backend: str = "auto"
    """"torch" (pageserve_kernels/cpu_attention.py), "triton" (pageserve_kernels/, needs CUDA), or "auto" by device."""
    seed: int = 0
    """Seeds the generators of requests that give no seed of their own."""
    enforce_eager: bool = False
    """Run decode steps through the Python layers: no CUDA graphs (engine/worker/decode_graphs.py), no C++
    layer loop on CPUs (engine/worker/native_layers.py)."""
    default_sampling: str | None = None
    """--default-sampling: a JSON object overriding the model's sampling defaults key by key
    (engine/worker/sampling_defaults.py); None: the model's own."""
    tensor_parallel_size: int = 1
    """Processes that each hold a shard of every layer (gloo on the CPU); 1: today's single process."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (off by default)."""

    def __post_init__(self) -> None:
        if self.attention_backend not in BACKENDS:
            raise ConfigError(f"attention_backend must be one of {BACKENDS}, not {self.attention_backend!r}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"--tensor-parallel-size must be at least 1, not {self.tensor_parallel_size}")
        if self.lora.enabled and self.tensor_parallel_size > 1:
            raise ConfigError("--enable-lora does not work with --tensor-parallel-size > 1 yet")
