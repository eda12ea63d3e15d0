"""Whether prompt chunks run the C prefill kernel or PyTorch's attention here: measured once per shape.

Two implementations of prompt attention exist (pageserve_kernels/cpu_attention.py): the C kernel
(pageserve_kernels/cpu_prefill.py), which reads context blocks in place, and PyTorch's
`scaled_dot_product_attention`, which needs them gathered first. Which is faster depends on
the CPU: on an AMD EPYC with AVX512-BF16 the C kernel takes 0.37-0.6x PyTorch's time on
SmolLM2's shapes, but PyTorch's CPU flash attention runs its products through oneDNN's
brgemm, which uses AMX tiles where the host has them, and no AMX code of ours can be tested on
a host without it. So, as for the products (engine/worker/layers/linear.py) and the fused ops
(pageserve_kernels/fused_choice.py), both are timed through pageserve_kernels/choice.py on one
representative prompt step (TIMING_CHUNKS: fresh prompts and continuations of cached ones) for
the model's dtype and head shape, cached per host, and the faster is planned for every step.
`PAGESERVE_KERNEL_CHOICE=prefill_attention=c|torch` forces one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pageserve_kernels import choice, cpu_prefill
from pageserve_kernels.cpu_attention import attend, plan_attention, store_kv

TIMING_CHUNKS = ((512, 0), (512, 0), (256, 768), (256, 768))
"""(new tokens, tokens cached before) of each chunk of the timed step: 1,536 prompt tokens, as a
step of chunked prefill with prefix hits carries them."""


def native_prompts_win(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
                       block_size: int) -> bool:
    """Whether steps should hand their prompt chunks to the C kernel (False where it is not built)."""
    kernel = cpu_prefill.load()
    if kernel is None or not cpu_prefill.supports(dtype, head_dim):
        return False
    name = str(dtype).removeprefix("torch.")
    made = choice.choose(  # once per engine start: a cached pick is a file read
        "prefill_attention", f"{name} n_q={num_heads} n_kv={num_kv_heads} hd={head_dim} block={block_size}",
        ["c", "torch"], lambda: timers(dtype, num_heads, num_kv_heads, head_dim, block_size))
    return made.pick == "c"


def timers(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
           chunks: Sequence[tuple[int, int]] = TIMING_CHUNKS) -> dict[str, Callable[[], torch.Tensor]]:
    """Each implementation attending one step of `chunks` (new tokens, tokens cached before) over a
    cache that already holds its K/V."""
    query_lens = [new for new, _ in chunks]
    seq_lens = [new + cached for new, cached in chunks]
    tables, next_block = [], 0
    for seq_len in seq_lens:
        blocks = -(-seq_len // block_size)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    gen = torch.Generator().manual_seed(0)
    shape = (next_block, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    fresh_kv = (torch.randn(query.shape[0], num_kv_heads, head_dim, generator=gen).to(dtype),
                torch.randn(query.shape[0], num_kv_heads, head_dim, generator=gen).to(dtype))
    plans = {"c": plan_attention(query_lens, seq_lens, tables, block_size, native=True, native_prompts=True),
             "torch": plan_attention(query_lens, seq_lens, tables, block_size, native=True, native_prompts=False)}
    store_kv(*fresh_kv, key_cache, value_cache, plans["c"].slot_mapping)  # as the engine writes a step's K/V first
    scale = head_dim**-0.5
    return {name: (lambda plan=plan: attend(query, key_cache, value_cache, plan, scale, fresh_kv))
            for name, plan in plans.items()}
