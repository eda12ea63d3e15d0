"""Build paged-attention batches for kernel tests, and compare against float64.

A batch's KV cache starts as NaN everywhere; only the slots of positions below
each request's seq_len get real keys and values. A kernel that reads a slot it
must not (past seq_len, an unused block-table entry) turns its output into NaN.
Block tables are random permutations of physical blocks, with spare entries
pointing at NaN blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOLERANCE = {  # (atol, rtol) against the float64 reference
    torch.float32: (2e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


@dataclass(frozen=True)
class AttentionBatch:
    query: torch.Tensor  # (T, n_q, hd)
    key_cache: torch.Tensor  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # (B, max_blocks) int32
    query_start_loc: torch.Tensor  # (B + 1,) int32
    seq_lens: torch.Tensor  # (B,) int32
    scale: float

    def args(self) -> tuple:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.query_start_loc,
            self.seq_lens,
            self.scale,
        )

    def to(self, device: str) -> AttentionBatch:
        return AttentionBatch(*(t.to(device) for t in self.args()[:-1]), scale=self.scale)

    def reference(self, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        from pageserve_kernels.reference import paged_attention_ref

        return paged_attention_ref(
            self.query.double(),
            self.key_cache.double(),
            self.value_cache.double(),
            self.block_tables,
            self.query_start_loc,
            self.seq_lens,
            self.scale,
            window,
            softcap,
        )

    def poison_outside_window(self, window: int) -> int:
        """NaN into every block that lies wholly before the window of each request's first query (so
        wholly outside every one of its queries' windows): a kernel that reads one returns NaN. Returns
        how many blocks were poisoned (a test should check there are some)."""
        bs = self.key_cache.shape[1]
        poisoned = 0
        for b in range(self.seq_lens.shape[0]):
            q_len = int(self.query_start_loc[b + 1] - self.query_start_loc[b])
            first_seen = int(self.seq_lens[b]) - q_len - window + 1  # first key of the first query's window
            for i in range(max(0, first_seen) // bs):
                blk = int(self.block_tables[b, i])
                self.key_cache[blk] = float("nan")
                self.value_cache[blk] = float("nan")
                poisoned += 1
        return poisoned


def make_batch(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    n_q: int,
    n_kv: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    spare_blocks: int = 2,
) -> AttentionBatch:
    assert len(q_lens) == len(seq_lens) and all(q <= s for q, s in zip(q_lens, seq_lens, strict=True))
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_needed) + spare_blocks
    num_blocks = sum(blocks_needed) + 2 * spare_blocks + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.empty(len(q_lens), max_blocks, dtype=torch.int32)
    nan = float("nan")
    key_cache = torch.full((num_blocks, block_size, n_kv, head_dim), nan, dtype=dtype)
    value_cache = torch.full_like(key_cache, nan)
    used = 0
    for b, (n_blocks, seq_len) in enumerate(zip(blocks_needed, seq_lens, strict=True)):
        table[b, :n_blocks] = perm[used : used + n_blocks].int()
        used += n_blocks
        # spare entries: blocks that are allocated to nobody and hold NaN
        spare = perm[sum(blocks_needed) :]
        table[b, n_blocks:] = spare[torch.randint(len(spare), (max_blocks - n_blocks,), generator=gen)].int()
        for pos in range(seq_len):
            blk, off = int(table[b, pos // block_size]), pos % block_size
            key_cache[blk, off] = torch.randn(n_kv, head_dim, generator=gen).to(dtype)
            value_cache[blk, off] = torch.randn(n_kv, head_dim, generator=gen).to(dtype)
    query = torch.randn(sum(q_lens), n_q, head_dim, generator=gen).to(dtype)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return AttentionBatch(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=table,
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        scale=head_dim**-0.5,
    )


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements are NaN (unwritten or poisoned)"
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
