"""The fast PyTorch attention path over the paged KV cache, for CPUs.

Same contract as `pageserve_kernels.reference` (`write_kv_ref`, `paged_attention_ref`),
but built for a whole model step: the engine builds one `AttentionPlan` per
step (pageserve_kernels/cpu_attention_plan.py) from host-side lists (no tensor -> int syncs) and every layer reuses it.

    flat batch rows:  [ decodes, longest context first | prefill chunks ... ]
                        └ DecodeGroup ┘└ DecodeGroup ┘   └ ChunkPlan ┘

Decodes (one query token each) dominate a serving step's attention, and they
are memory-bound: every step reads each running request's whole K/V. Two ways:

  native   a small C kernel (pageserve_kernels/cpu_decode.py, compiled once with the
           system C compiler, OpenMP over (request, KV head)) reads the blocks
           in place through the block table: one pass over the KV bytes.
  torch    fallback without a compiler: decodes are bucketed by context length
           into a few groups; a group gathers its blocks (`index_select`),
           padded to the group's longest context and masked, and runs one
           batched `scaled_dot_product_attention` (GQA without repeating K/V).
           Three passes over the KV bytes (gather read, write, attention read).

Prompt chunks, with the native kernels where the C prefill kernel measured faster than PyTorch's
SDPA on this host (pageserve_kernels/prefill_choice.py): one C call for all of them
(pageserve_kernels/cpu_prefill.py) reads context and chunk K/V in place through the block
tables. Otherwise a chunk whose request has nothing cached yet (context_len == 0)
attends causally to the step's own K/V and never touches the cache; a chunk
that continues a prompt (chunked prefill, prefix hit, recompute) gathers its
blocks and uses an explicit (L, S) causal mask shifted by the context length.

Sliding windows and soft-caps are per layer, the plan per step: `attend` takes both and hands them to
the C kernels; the PyTorch paths build the window's masks per layer (a windowed fresh chunk can no
longer use SDPA's is_causal), skip a continued chunk's blocks before its window, and take an eager
softmax where scores are capped (SDPA has no soft-cap).

This file knows nothing about models, requests or scheduling: only token
counts, block tables and tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pageserve_kernels import cpu_decode, cpu_fused, cpu_prefill  # noqa: F401  (tests patch their loaders here)
from pageserve_kernels.checks import check_window_softcap
from pageserve_kernels.cpu_attention_plan import (  # re-exported: the plan is built here for callers
    AttentionPlan,
    ChunkPlan,
    DecodeGroup,
    NativeDecodePlan,
    NativePrefillPlan,
    native_decode_available,
    plan_attention,
)


def write_kv(
    key: torch.Tensor,  # (T, n_kv, hd)
    value: torch.Tensor,  # (T, n_kv, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 marks a padded token that is not written
) -> None:
    """write_kv_ref as two index_copy_ calls (no Python loop)."""
    slots = slot_mapping.long()
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        key, value, slots = key[keep], value[keep], slots[keep]
    store_kv(key.to(key_cache.dtype), value.to(value_cache.dtype), key_cache, value_cache, slots)


def store_kv(
    key: torch.Tensor,  # (T, n_kv, hd), the cache's dtype
    value: torch.Tensor,
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd)
    value_cache: torch.Tensor,
    slots: torch.Tensor,  # (T,) int64, no padding (a planned step never has any)
) -> None:
    native = cpu_fused.load()  # one C call (a row copy each); two index_copy_ and their views cost 66 us a layer
    if native is not None and native.store_kv(key, value, key_cache, value_cache, slots):
        return
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value)


def attend(
    query: torch.Tensor,  # (T, n_q, hd)
    key_cache: torch.Tensor,  # (num_blocks, block_size, n_kv, hd), already holding this step's K/V
    value_cache: torch.Tensor,
    plan: AttentionPlan,
    scale: float,
    fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # this step's (T, n_kv, hd) K and V
    sanitize: bool = False,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # (T, n_q, hd)
    """Attention of every planned row; `fresh_kv` spares fresh prefills a trip through the cache.

    `window` > 0: each query sees only its last `window` keys; `softcap` > 0: scores capped to
    softcap * tanh(score / softcap) (pageserve_kernels/reference.py). The plan is the step's, shared by
    every layer, so a window's masks are built here, per layer, and only for a windowed layer.
    Padded decode slots are masked, but a masked NaN still poisons the sum (0 * NaN); the
    engine's cache holds only finite values (zero-initialised, then written K/V), so only
    callers with arbitrary caches (`paged_attention`) pay for `sanitize`.
    """
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # (T, n_q, hd) contiguous
    if plan.native_decode is not None:
        nd = plan.native_decode
        kernel = cpu_decode.load()
        assert kernel is not None, "planned for the native kernel, which is not available"
        kernel(out, query, key_cache, value_cache, nd.rows, nd.block_tables, nd.seq_lens,
               nd.max_seq_len, scale, window=window, softcap=softcap)
    _attend_decode_groups(out, query, key_cache, value_cache, plan, scale, sanitize, window, softcap)
    chunks = plan.chunks
    npf = plan.native_prefill
    if npf is not None and plan.prompts_in_c and cpu_prefill.supports(query.dtype, query.shape[2]):
        kernel = cpu_prefill.load()
        assert kernel is not None, "planned for the native prefill kernel, which is not available"
        kernel(out, query, key_cache, value_cache, npf.starts, npf.lens, npf.context_lens, npf.block_tables, scale,
               window, softcap)
        chunks = ()
    for c in chunks:
        out[c.start : c.end] = _attend_chunk(c, query, key_cache, value_cache, scale, fresh_kv, window, softcap)
    return out


def _attend_decode_groups(
    out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, plan: AttentionPlan,
    scale: float, sanitize: bool, window: int, softcap: float,
) -> None:
    """The PyTorch decode groups: each gathers its requests' blocks, padded to its longest, and attends at once."""
    n_q, hd = query.shape[1], query.shape[2]
    bs, n_kv = key_cache.shape[1], key_cache.shape[2]
    for g in plan.decode_groups:
        s = g.num_blocks * bs
        k = key_cache.index_select(0, g.block_index).view(g.num_requests, s, n_kv, hd).transpose(1, 2)
        v = value_cache.index_select(0, g.block_index).view(g.num_requests, s, n_kv, hd).transpose(1, 2)
        mask = g.mask
        if window > 0:  # keys at seq_len - window .. seq_len - 1 only (and none of the padding)
            assert g.seq_lens is not None, "a decode group without lengths"
            pos = torch.arange(s, device=query.device)
            mask = (pos < g.seq_lens) & (pos >= g.seq_lens - window)  # (G, 1, 1, S)
        if sanitize and mask is not None:
            pad = ~mask.view(g.num_requests, 1, s, 1)
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        q = query[g.rows].unsqueeze(2)  # (G, n_q, 1, hd)
        o = _sdpa(q, k, v, mask, scale, softcap)
        out[g.rows] = o.view(g.num_requests, n_q, hd)


def _attend_chunk(
    c: ChunkPlan, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, scale: float,
    fresh_kv: tuple[torch.Tensor, torch.Tensor] | None, window: int, softcap: float,
) -> torch.Tensor:  # (L, n_q, hd)
    """One prompt chunk by PyTorch: causal over its own K/V when fresh, else over its gathered blocks."""
    q_len = c.end - c.start
    q = query[c.start : c.end].transpose(0, 1).unsqueeze(0)  # (1, n_q, L, hd)
    plain = window == 0 and softcap == 0.0
    if c.context_len == 0 and fresh_kv is not None:
        k = fresh_kv[0][c.start : c.end].transpose(0, 1).unsqueeze(0)  # (1, n_kv, L, hd)
        v = fresh_kv[1][c.start : c.end].transpose(0, 1).unsqueeze(0)
        if plain:  # SDPA's own causal mask (is_causal) cannot express a window, nor cap scores
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            o = _sdpa(q, k, v, _causal_mask(q_len, q_len, 0, window, q.device), scale, softcap)
        return o[0].transpose(0, 1)
    seq_len = c.context_len + q_len
    bs = key_cache.shape[1]
    # Blocks wholly before the first query's window are never read.
    skip = max(0, c.context_len - window + 1) // bs if window > 0 else 0
    k = _gather(key_cache, c.block_index[skip:], seq_len - skip * bs).transpose(0, 1).unsqueeze(0)  # (1, n_kv, S', hd)
    v = _gather(value_cache, c.block_index[skip:], seq_len - skip * bs).transpose(0, 1).unsqueeze(0)
    if plain and c.mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    elif plain:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=c.mask, scale=scale, enable_gqa=True)
    else:
        o = _sdpa(q, k, v, _causal_mask(q_len, seq_len, skip * bs, window, q.device), scale, softcap)
    return o[0].transpose(0, 1)


def _causal_mask(q_len: int, seq_len: int, first_key: int, window: int, device: torch.device) -> torch.Tensor:
    """(L, S) bool, True = attend: queries at seq_len - q_len .. seq_len - 1 over keys first_key .. seq_len - 1,
    each seeing the keys at or before it, and with a window (> 0) only its last `window`."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(first_key, seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    return mask & (k_pos > q_pos - window) if window > 0 else mask


def _sdpa(
    q: torch.Tensor,  # (B, n_q, L, hd)
    k: torch.Tensor,  # (B, n_kv, S, hd)
    v: torch.Tensor,
    mask: torch.Tensor | None,  # bool, True = attend, broadcast to (B, n_q, L, S)
    scale: float,
    softcap: float,
) -> torch.Tensor:  # (B, n_q, L, hd)
    """PyTorch's attention, or with a soft-cap (which SDPA has no argument for) the eager softmax."""
    if softcap == 0.0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    grp = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(grp, dim=1), v.repeat_interleave(grp, dim=1)  # (B, n_q, S, hd)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, n_q, L, S)
    scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


def _gather(cache: torch.Tensor, block_index: torch.Tensor, seq_len: int) -> torch.Tensor:
    return cache.index_select(0, block_index).view(-1, *cache.shape[2:])[:seq_len]  # (S, n_kv, hd)


def paged_attention(
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
    """paged_attention_ref's signature: plans the batch, then attends (K/V already written)."""
    check_window_softcap(window, softcap)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    query_lens = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    keep = [i for i, q in enumerate(query_lens) if q > 0]
    bs = key_cache.shape[1]
    tables = [block_tables[i, : (lens[i] + bs - 1) // bs].tolist() for i in keep]
    native = native_decode_available(query.dtype, query.device) and key_cache.is_contiguous()
    plan = plan_attention([query_lens[i] for i in keep], [lens[i] for i in keep], tables, bs, query.device, native)
    if len(keep) != len(query_lens):  # empty requests leave holes: re-plan rows by their real starts
        plan = _shift_rows(plan, [starts[i] for i in keep], [query_lens[i] for i in keep])
    return attend(query, key_cache, value_cache, plan, scale, sanitize=True, window=window, softcap=softcap)


def _shift_rows(plan: AttentionPlan, starts: list[int], query_lens: list[int]) -> AttentionPlan:
    """Re-map a plan made for packed rows onto rows that start at `starts` (holes between)."""
    packed = [0]
    for q in query_lens:
        packed.append(packed[-1] + q)
    where = {p: s for p, s in zip(packed[:-1], starts, strict=True)}
    groups = []
    for g in plan.decode_groups:
        rows = range(g.rows.start, g.rows.stop) if isinstance(g.rows, slice) else g.rows.tolist()
        real = torch.tensor([where[r] for r in rows], dtype=torch.int64, device=plan.slot_mapping.device)
        groups.append(DecodeGroup(real, g.num_requests, g.num_blocks, g.block_index, g.mask, g.seq_lens))
    native = plan.native_decode
    if native is not None:
        rows = torch.tensor([where[r] for r in native.rows.tolist()], dtype=torch.int64, device=native.rows.device)
        native = NativeDecodePlan(rows, native.block_tables, native.seq_lens, native.max_seq_len)
    chunks = [
        ChunkPlan(where[c.start], where[c.start] + c.end - c.start, c.context_len, c.block_index, c.mask)
        for c in plan.chunks
    ]
    prefill = plan.native_prefill
    if prefill is not None:
        starts_t = torch.tensor([where[r] for r in prefill.starts.tolist()], dtype=torch.int64,
                                device=prefill.starts.device)
        prefill = NativePrefillPlan(starts_t, prefill.lens, prefill.context_lens, prefill.block_tables)
    return AttentionPlan(plan.slot_mapping, tuple(groups), tuple(chunks), plan.block_size, native, prefill,
                         plan.prompts_in_c)
