"""Prompt attention on the CPU: the C kernel against PyTorch's SDPA, and the one this host picks.

    python -m ops.bench.kernels.cpu_prefill                      # SmolLM2-135M shapes, bfloat16, 2 threads
    python -m ops.bench.kernels.cpu_prefill --dtype float32 --chunks 464x0 464x0 --threads 1

One "step" is one layer's prompt attention over a batch of chunks (`--chunks NEWxCACHED`: new
prompt tokens and tokens already cached before them, as a step of chunked prefill with prefix hits
carries them; the default is the engine's own timing step, pageserve_kernels/prefill_choice.py).
Each implementation runs exactly as the engine would call it (pageserve_kernels/cpu_attention.py).
Per implementation: the best of `--rounds` interleaved rounds in milliseconds, and GFLOP/s over
the causal products the step must do (4 x head size per visible query-key pair and query head).
The last line is what the engine's per-host choice (pageserve_kernels/choice.py) picks.
A script, not a test: tests/kernels/test_cpu_attention.py checks results.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ops.bench.kernels import add_head_shape
from pageserve_kernels import prefill_choice


def parse_chunk(text: str) -> tuple[int, int]:
    new, _, cached = text.partition("x")
    return int(new), int(cached or 0)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.cpu_prefill", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--chunks", type=parse_chunk, nargs="+", default=list(prefill_choice.TIMING_CHUNKS),
                   metavar="NEWxCACHED")
    add_head_shape(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    return p.parse_args(argv)


def causal_flops(chunks: list[tuple[int, int]], heads: int, head_dim: int) -> int:
    """Q . K^T and P . V over every visible (query, key) pair: 2 products x 2 FLOP x head size."""
    pairs = sum(new * cached + new * (new + 1) // 2 for new, cached in chunks)
    return pairs * heads * 4 * head_dim


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    timers = prefill_choice.timers(dtype, a.heads, a.kv_heads, a.head_dim, a.block_size, a.chunks)
    best: dict[str, float] = {}
    for _ in range(a.rounds):
        for name, run in timers.items():
            start = time.perf_counter()
            run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    flops = causal_flops(a.chunks, a.heads, a.head_dim)
    shown = " ".join(f"{new}x{cached}" for new, cached in a.chunks)
    print(f"prompt attention, {a.dtype}, chunks {shown} (new x cached), {a.heads}/{a.kv_heads} heads of "
          f"{a.head_dim}, {a.threads} threads: {flops / 1e9:.2f} GFLOP a step")
    for name, seconds in best.items():
        print(f"  {name:6s} {seconds * 1e3:8.2f} ms/step  {flops / seconds / 1e9:6.1f} GFLOP/s  "
              f"{best['torch'] / seconds:5.2f}x torch")
    win = prefill_choice.native_prompts_win(dtype, a.heads, a.kv_heads, a.head_dim, a.block_size)
    print(f"this host's pick (pageserve_kernels/choice.py, cached): {'c' if win else 'torch'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
