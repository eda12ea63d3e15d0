"""Plain-PyTorch references for every kernel: the definition of correct.

KV cache layout, one pair of tensors per layer:

    key_cache, value_cache: (num_blocks, block_size, num_kv_heads, head_dim)

A request's block table maps logical block i to a physical block; token at
position p lives in slot  block_table[p // block_size] * block_size + p % block_size.

    block_table  [7, 2, 9]       block_size = 4
    positions     0..3 -> block 7, 4..7 -> block 2, 8..9 -> block 9 (slots 36, 37)

A batch is flat: T query tokens from B requests, request b owning rows
query_start_loc[b] : query_start_loc[b + 1]. seq_lens[b] counts every token of
request b in the cache after this step's write, so its queries sit at positions
seq_lens[b] - q_len_b ... seq_lens[b] - 1 and attend causally to all earlier ones (with a
sliding window, to the last `window` of them; transformers' semantics, see paged_attention_ref).
These functions are slow on purpose (one request at a time); tests compare the
Triton kernels and the fast CPU path against them.
"""

from __future__ import annotations

import torch


def write_kv_ref(
    key: torch.Tensor,  # (T, n_kv, hd)
    value: torch.Tensor,  # (T, n_kv, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 marks a padded token that is not written
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key[keep].to(key_cache.dtype)
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value[keep].to(value_cache.dtype)


def gather_kv_ref(
    cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    block_table: torch.Tensor,  # (max_blocks,) int
    seq_len: int,
) -> torch.Tensor:  # (seq_len, n_kv, hd)
    block_size = cache.shape[1]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:n_blocks].long()]  # (n_blocks, block_size, n_kv, hd)
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(
    query: torch.Tensor,  # (T, n_q, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    query_start_loc: torch.Tensor,  # (B + 1,) int32
    seq_lens: torch.Tensor,  # (B,) int32
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # (T, n_q, hd)
    """`window` > 0: a query at position p sees keys k with p - window < k <= p (transformers'
    sliding window, `kv_idx > q_idx - sliding_window`); 0 sees every earlier key. `softcap` > 0: the
    scaled scores become softcap * tanh(score / softcap) before the mask (Gemma 2); 0 leaves them."""
    out = torch.empty_like(query)
    n_q, n_kv = query.shape[1], key_cache.shape[2]
    group = n_q // n_kv
    for b in range(block_tables.shape[0]):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if q1 == q0:
            continue
        seq_len = int(seq_lens[b])
        k = gather_kv_ref(key_cache, block_tables[b], seq_len).to(query.dtype)
        v = gather_kv_ref(value_cache, block_tables[b], seq_len).to(query.dtype)
        k = k.repeat_interleave(group, dim=1)  # (S, n_q, hd)
        v = v.repeat_interleave(group, dim=1)
        q = query[q0:q1]  # (L, n_q, hd)
        scores = torch.einsum("lhd,shd->hls", q, k) * scale  # (n_q, L, S)
        q_pos = torch.arange(seq_len - (q1 - q0), seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        if softcap > 0:
            scores = softcap * torch.tanh(scores.float() / softcap)
        hidden = k_pos[None, :] > q_pos[:, None]  # (L, S) causal
        if window > 0:
            hidden |= k_pos[None, :] <= q_pos[:, None] - window
        scores = scores.masked_fill(hidden[None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        out[q0:q1] = torch.einsum("hls,shd->lhd", probs, v)
    return out


def copy_blocks_ref(
    caches: list[torch.Tensor],  # each (num_blocks, block_size, n_kv, hd)
    src_dst: torch.Tensor,  # (N, 2) int64: copy block src -> block dst in every cache
) -> None:
    for cache in caches:
        for src, dst in src_dst.tolist():
            cache[dst].copy_(cache[src])


def swap_blocks_ref(
    src_cache: torch.Tensor,  # (num_blocks_src, block_size, n_kv, hd), device or CPU pool
    dst_cache: torch.Tensor,  # (num_blocks_dst, block_size, n_kv, hd), the other pool
    src_dst: torch.Tensor,  # (N, 2) int64 pairs (block in src_cache, block in dst_cache)
) -> None:
    for src, dst in src_dst.tolist():
        dst_cache[dst].copy_(src_cache[src])
