"""One step's attention plan for the CPU path (pageserve_kernels/cpu_attention.py executes it).

Built once per step from host-side lists (no tensor -> int syncs) and reused by every layer: the
slot of each new token, decodes grouped by context length (or laid out for the native C decode
kernel), and each prompt chunk's rows (or the native prefill kernel's tables). Knows nothing about
models, requests or scheduling: only token counts, block tables and tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pageserve_kernels import cpu_decode, cpu_prefill

# Cost of one extra decode group per layer, in units of padded blocks: a group costs
# a few op launches (~40 us); one padded block costs gathering + attending 16 tokens.
GROUP_OVERHEAD_BLOCKS = 24
MAX_DECODE_GROUPS = 8


@dataclass(frozen=True)
class DecodeGroup:
    """Requests with one query token each, attended to together."""

    rows: slice | torch.Tensor
    """Their rows of the flat batch: a slice when contiguous, else (G,) int64 indices."""
    num_requests: int
    num_blocks: int
    """Blocks per request after padding to the group's longest context."""
    block_index: torch.Tensor
    """(G * num_blocks,) int64 physical blocks, request-major; padding repeats a real block."""
    mask: torch.Tensor | None
    """(G, 1, 1, num_blocks * block_size) bool, True = attend; None when nothing is padded."""
    seq_lens: torch.Tensor | None = None
    """(G, 1, 1, 1) int64 each request's length: a sliding window's mask is built from it per layer."""


@dataclass(frozen=True)
class NativeDecodePlan:
    """All decode rows at once, for the C kernel (pageserve_kernels/cpu_decode.py): no padding, no gather."""

    rows: torch.Tensor
    """(D,) int64 rows of the flat batch."""
    block_tables: torch.Tensor
    """(D, max_blocks) int64, padded with block 0 past each request's blocks (never read)."""
    seq_lens: torch.Tensor
    """(D,) int64"""
    max_seq_len: int


@dataclass(frozen=True)
class ChunkPlan:
    """Several query tokens of one request (a prompt or a piece of one)."""

    start: int
    end: int
    """Rows start:end of the flat batch."""
    context_len: int
    """Tokens of this request already in the cache before the chunk."""
    block_index: torch.Tensor
    """(num_blocks,) int64 blocks covering context + chunk."""
    mask: torch.Tensor | None
    """(L, S) bool causal mask shifted by context_len; None when context_len == 0."""


@dataclass(frozen=True)
class NativePrefillPlan:
    """Every prompt chunk at once, for the C kernel (pageserve_kernels/cpu_prefill.py): no gather, no mask."""

    starts: torch.Tensor
    """(C,) int64 first row of each chunk in the flat batch."""
    lens: torch.Tensor
    """(C,) int64 query tokens of each chunk."""
    context_lens: torch.Tensor
    """(C,) int64 tokens of the request cached before the chunk."""
    block_tables: torch.Tensor
    """(C, max_blocks) int64, padded with block 0 past each chunk's blocks (never read)."""


@dataclass(frozen=True)
class AttentionPlan:
    slot_mapping: torch.Tensor
    """(T,) int64: the cache slot each row's K/V is written to."""
    decode_groups: tuple[DecodeGroup, ...]
    """Decodes for the PyTorch path (empty when `native_decode` is set)."""
    chunks: tuple[ChunkPlan, ...]
    block_size: int
    native_decode: NativeDecodePlan | None = None
    native_prefill: NativePrefillPlan | None = None
    """The chunks again, laid out for the C prefill kernel and the C++ layer loop (engine/worker/native_layers.py)."""
    prompts_in_c: bool = False
    """The C prefill kernel attends the chunks (where it supports the dtype); else PyTorch's SDPA."""


def native_decode_available(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """Whether plans for this dtype/device can hand decodes to the C kernel."""
    return torch.device(device).type == "cpu" and dtype in cpu_decode.SUPPORTED and cpu_decode.load() is not None


def compute_slot_mapping(
    query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int
) -> list[int]:
    """Slots of every query row: block_table[p // block_size] * block_size + p % block_size."""
    slots: list[int] = []
    for q_len, seq_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
        pos = seq_len - q_len
        while pos < seq_len:
            block, offset = divmod(pos, block_size)
            take = min(block_size - offset, seq_len - pos)
            base = table[block] * block_size + offset
            slots.extend(range(base, base + take))
            pos += take
    return slots


def plan_attention(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    native: bool = False,
    native_prompts: bool = True,
) -> AttentionPlan:
    """Plan one step. Requests are in flat-batch order; seq_lens count the cache after the write.

    `native` hands the decodes to the C kernel (check `native_decode_available` first), lays the prompt
    chunks out for the C kernels, and hands them to the C prefill kernel where that one is built, unless
    `native_prompts` is False (PyTorch's attention measured faster here: pageserve_kernels/prefill_choice.py).
    """
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    decode = [i for i, q in enumerate(query_lens) if q == 1]
    native_plan = None
    if native and decode:
        native_plan = _native_decode([starts[i] for i in decode], [seq_lens[i] for i in decode],
                                     [block_tables[i] for i in decode], block_size, device)
        decode = []
    decode.sort(key=lambda i: -seq_lens[i])
    groups = [
        _decode_group([starts[i] for i in members], [seq_lens[i] for i in members],
                      [block_tables[i] for i in members], block_size, device)
        for members in _bucket([(seq_lens[i] + block_size - 1) // block_size for i in decode], decode)
    ]
    chunks = [
        _chunk(starts[i], starts[i + 1], seq_lens[i], block_tables[i], block_size, device)
        for i, q in enumerate(query_lens)
        if q > 1
    ]
    prefill_plan = None
    if native and chunks:
        prompt = [i for i, q in enumerate(query_lens) if q > 1]
        prefill_plan = _native_prefill([starts[i] for i in prompt], [query_lens[i] for i in prompt],
                                       [seq_lens[i] for i in prompt], [block_tables[i] for i in prompt],
                                       block_size, device)
    slots = compute_slot_mapping(query_lens, seq_lens, block_tables, block_size)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    prompts_in_c = native and native_prompts and cpu_prefill.load() is not None
    return AttentionPlan(slot_mapping, tuple(groups), tuple(chunks), block_size, native_plan, prefill_plan,
                         prompts_in_c)


def _native_decode(
    rows: list[int], seq_lens: list[int], tables: list[list[int]], block_size: int, device: torch.device | str
) -> NativeDecodePlan:
    return NativeDecodePlan(
        rows=torch.tensor(rows, dtype=torch.int64, device=device),
        block_tables=_padded_tables(tables, seq_lens, block_size, device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        max_seq_len=max(seq_lens),
    )


def _native_prefill(
    starts: list[int], lens: list[int], seq_lens: list[int], tables: list[list[int]], block_size: int,
    device: torch.device | str,
) -> NativePrefillPlan:
    return NativePrefillPlan(
        starts=torch.tensor(starts, dtype=torch.int64, device=device),
        lens=torch.tensor(lens, dtype=torch.int64, device=device),
        context_lens=torch.tensor([s - q for s, q in zip(seq_lens, lens, strict=True)], dtype=torch.int64,
                                  device=device),
        block_tables=_padded_tables(tables, seq_lens, block_size, device),
    )


def _padded_tables(
    tables: list[list[int]], seq_lens: list[int], block_size: int, device: torch.device | str
) -> torch.Tensor:
    """(R, max_blocks) int64: each request's used blocks, padded with block 0 (never read)."""
    nbs = [(s + block_size - 1) // block_size for s in seq_lens]
    width = max(nbs)
    return torch.tensor([t[:n] + [0] * (width - n) for t, n in zip(tables, nbs, strict=True)], dtype=torch.int64,
                        device=device)


def _bucket(num_blocks: list[int], ids: list[int]) -> list[list[int]]:
    """Split requests sorted by descending block count into groups minimising padded work.

    Dynamic programming over the sorted list: cost(group) = overhead + size * longest.
    """
    n = len(ids)
    if n == 0:
        return []
    best = [0.0] + [float("inf")] * n  # best[i]: cost of the first i requests
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(max(0, i - n), i):  # group = j .. i-1, longest is num_blocks[j]
            cost = best[j] + GROUP_OVERHEAD_BLOCKS + (i - j) * num_blocks[j]
            if cost < best[i]:
                best[i], cut[i] = cost, j
    bounds, i = [], n
    while i > 0:
        bounds.append((cut[i], i))
        i = cut[i]
    bounds.reverse()
    while len(bounds) > MAX_DECODE_GROUPS:  # merge the two cheapest neighbours
        k = min(range(len(bounds) - 1), key=lambda k: bounds[k + 1][1] - bounds[k][0])
        bounds[k : k + 2] = [(bounds[k][0], bounds[k + 1][1])]
    return [ids[a:b] for a, b in bounds]


def _decode_group(
    rows: list[int], seq_lens: list[int], tables: list[list[int]], block_size: int, device: torch.device | str
) -> DecodeGroup:
    nb = (max(seq_lens) + block_size - 1) // block_size
    index: list[int] = []
    for table, seq_len in zip(tables, seq_lens, strict=True):
        used = table[: (seq_len + block_size - 1) // block_size]
        index.extend(used)
        index.extend([used[0]] * (nb - len(used)))  # padding: any real block, masked out
    mask = None
    if any(s != nb * block_size for s in seq_lens):
        lens = torch.tensor(seq_lens, device=device)
        mask = (torch.arange(nb * block_size, device=device)[None, :] < lens[:, None]).view(len(rows), 1, 1, -1)
    contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
    row_sel: slice | torch.Tensor = (
        slice(rows[0], rows[0] + len(rows)) if contiguous else torch.tensor(rows, dtype=torch.int64, device=device)
    )
    block_index = torch.tensor(index, dtype=torch.int64, device=device)
    lens_t = torch.tensor(seq_lens, dtype=torch.int64, device=device).view(len(rows), 1, 1, 1)
    return DecodeGroup(row_sel, len(rows), nb, block_index, mask, lens_t)


def _chunk(
    start: int, end: int, seq_len: int, table: list[int], block_size: int, device: torch.device | str
) -> ChunkPlan:
    q_len = end - start
    context_len = seq_len - q_len
    nb = (seq_len + block_size - 1) // block_size
    block_index = torch.tensor(table[:nb], dtype=torch.int64, device=device)
    if context_len == 0:
        return ChunkPlan(start, end, 0, block_index, None)
    mask = torch.ones(q_len, seq_len, dtype=torch.bool, device=device).tril(diagonal=context_len)
    return ChunkPlan(start, end, context_len, block_index, mask)
