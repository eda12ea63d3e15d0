"""The CPU decode attention kernel's loop variants side by side, and the one this host picks.

    python -m ops.bench.kernels.cpu_decode                       # SmolLM2-135M shapes, bfloat16, 2 threads
    python -m ops.bench.kernels.cpu_decode --dtype float32 --threads 1

One "step" is a decode batch (`--requests` requests, contexts uniform in `--context`)
through `--layers` layers, each layer with its own K/V pool so that, as in the engine,
the step streams its KV bytes from memory rather than from the caches. Per variant
this host has (pageserve_kernels/cpu_decode.py): the best of `--rounds` interleaved
rounds, in milliseconds per step, and GB/s over the K and V bytes the step must read.
The last line is what the engine's per-host choice (pageserve_kernels/choice.py) picks.
A script, not a test: tests/kernels/test_cpu_decode_variants.py checks results.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from engine.worker.host_allocator import zeros_on_huge_pages
from ops.bench.kernels import add_head_shape
from pageserve_kernels import cpu_decode


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.cpu_decode", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--context", type=int, nargs=2, default=[48, 768], metavar=("MIN", "MAX"))
    p.add_argument("--layers", type=int, default=30)
    add_head_shape(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                   help="every request begins with the same blocks holding TOKENS tokens (a system prompt the "
                        "prefix cache keeps once), then its own; --context counts both")
    return p.parse_args(argv)


def block_tables(lens: torch.Tensor, bs: int, shared: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """Each request's blocks anywhere in the pool, after `shared` blocks common to all: (tables, pool blocks)."""
    width = int(-(-lens.max() // bs))
    num_blocks = shared + len(lens) * (width - shared)
    own = torch.randperm(num_blocks - shared, generator=gen).view(len(lens), width - shared) + shared
    return torch.cat([torch.arange(shared).expand(len(lens), shared), own], dim=1).contiguous(), num_blocks


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    kernel = cpu_decode.load()
    if kernel is None:
        print("the native decode kernel is not available here (no C compiler, or PAGESERVE_NATIVE_KERNELS=0)")
        return 1
    torch.set_num_threads(a.threads)
    dtype, bs = getattr(torch, a.dtype), a.block_size
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(a.context[0], a.context[1] + 1, (a.requests,), generator=gen)
    shared = -(-a.shared_prefix // bs)
    if shared and int(lens.min()) <= shared * bs:
        raise SystemExit(f"--shared-prefix {a.shared_prefix} needs every context above {shared * bs} tokens")
    tables, num_blocks = block_tables(lens, bs, shared, gen)
    shape = (num_blocks, bs, a.kv_heads, a.head_dim)
    pool = zeros_on_huge_pages((a.layers, 2, *shape), dtype)  # the engine's KV pool (engine/worker/kv_cache.py)
    for layer_kv in pool.view(-1, *shape):
        layer_kv.copy_(torch.randn(shape, generator=gen))
    pools = [(pool[layer, 0], pool[layer, 1]) for layer in range(a.layers)]
    query = torch.randn(a.requests, a.heads, a.head_dim, generator=gen).to(dtype)
    out = torch.empty_like(query)
    rows = torch.arange(a.requests)
    step_bytes = int(lens.sum()) * 2 * a.kv_heads * a.head_dim * dtype.itemsize * a.layers
    best: dict[str, float] = {}
    variants = kernel.applicable(dtype, a.head_dim)
    for _ in range(a.rounds):
        for v in variants:
            start = time.perf_counter()
            for kc, vc in pools:
                kernel(out, query, kc, vc, rows, tables, lens, int(lens.max()), a.head_dim**-0.5, v)
            best[v] = min(best.get(v, float("inf")), time.perf_counter() - start)
    common = f" (the first {shared * bs} shared, counted per request below)" if shared else ""
    print(f"decode attention, {a.dtype}, {a.requests} requests of {a.context[0]}-{a.context[1]} tokens{common}, "
          f"{a.layers} layers, {a.heads}/{a.kv_heads} heads of {a.head_dim}, {a.threads} threads: "
          f"{step_bytes / 1e6:.0f} MB of K/V per step")
    for v in variants:
        print(f"  {v:12s} {best[v] * 1e3:8.2f} ms/step  {step_bytes / best[v] / 1e9:6.1f} GB/s  "
              f"{best['scalar'] / best[v]:5.2f}x scalar")
    pick = kernel.pick(dtype, a.heads, a.kv_heads, a.head_dim, bs)
    print(f"this host's pick (pageserve_kernels/choice.py, cached): {pick}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
