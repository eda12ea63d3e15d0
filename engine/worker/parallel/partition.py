"""Which slice of every layer each tensor-parallel rank holds: pure arithmetic over the model's shape.

    KV heads      split as evenly as possible, lower ranks take the extra one
                  (SmolLM2-135M, 3 KV heads on 2 ranks: rank 0 [0, 2), rank 1 [2, 3));
    query heads   follow their KV head (GQA group g = heads / kv_heads: KV head j serves
                  query heads [j g, (j + 1) g)), so attention never crosses ranks;
    intermediate  (gate/up rows, down columns) split as evenly as possible;
    vocabulary    (embedding and LM head rows) in slices of ceil(V / N), the last one shorter.

An uneven split is legal everywhere: the row-parallel products (o_proj, down_proj) sum
partial products of any widths. This module decides the split once; it knows nothing
about tensors, processes or collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ConfigError
from engine.worker.models.spec import ModelSpec

FLAG = "--tensor-parallel-size"


@dataclass(frozen=True)
class ShardPlan:
    """One rank's ranges ([start, stop) each) of the full model's heads, MLP columns and vocabulary."""

    rank: int
    world_size: int
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]
    vocab_slice: int
    """ceil(V / N): every rank's logits are padded to this width before they are gathered."""
    vocab_total: int
    """V: the gathered logits' width."""

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def num_q_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def intermediate_size(self) -> int:
        return self.intermediate[1] - self.intermediate[0]

    @property
    def vocab_size(self) -> int:
        return self.vocab[1] - self.vocab[0]


def even_split(total: int, parts: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank` when `total` items are split into `parts` runs differing by at most one."""
    base, extra = divmod(total, parts)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def check_tensor_parallel(shape: ModelSpec, world_size: int, device: str) -> None:
    """Raise ConfigError, naming the flag, when this model cannot be split this way."""
    if world_size < 1:
        raise ConfigError(f"{FLAG} must be at least 1, not {world_size}")
    if world_size == 1:
        return
    if world_size > shape.num_kv_heads:
        raise ConfigError(f"{FLAG} {world_size} exceeds the model's {shape.num_kv_heads} KV heads "
                          f"(each rank needs at least one KV head)")
    if not device.startswith("cpu"):
        raise ConfigError(f"{FLAG} > 1 runs on the CPU (torch.distributed gloo); device {device!r} is not supported")


def plan_shards(shape: ModelSpec, world_size: int, rank: int) -> ShardPlan:
    group = shape.num_heads // shape.num_kv_heads
    kv = even_split(shape.num_kv_heads, world_size, rank)
    slice_ = -(-shape.vocab_size // world_size)
    vocab_start = min(shape.vocab_size, rank * slice_)
    return ShardPlan(
        rank=rank,
        world_size=world_size,
        kv_heads=kv,
        q_heads=(kv[0] * group, kv[1] * group),
        intermediate=even_split(shape.intermediate_size, world_size, rank),
        vocab=(vocab_start, min(shape.vocab_size, vocab_start + slice_)),
        vocab_slice=slice_,
        vocab_total=shape.vocab_size,
    )
