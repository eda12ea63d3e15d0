"""The fused elementwise ops (pageserve_kernels/cpu_fused.py) against their PyTorch references, side by side.

    python -m ops.bench.kernels.fused                 # SmolLM2-135M shapes, 64 decode rows and 2048 prefill rows
    python -m ops.bench.kernels.fused --rows 1 7 64   # other row counts

Per op and row count: microseconds of each path (the best of 5 interleaved
rounds, each the median of its calls: a busy machine slows whole rounds, and
both paths alike), the speed-up, and the C kernel's
GB/s over the bytes it must move (read inputs + write outputs once).
This file is a script, not a test; tests/kernels/test_cpu_fused.py checks results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from ops.bench.kernels import add_head_shape
from pageserve_kernels import cpu_fused
from pageserve_kernels.fused_ops import (
    fused_add_rms_norm_reference,
    rms_norm_reference,
    rotary_reference,
    silu_and_mul_reference,
)

Op = Callable[[], object]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.fused", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 2048], help="T: tokens in the step")
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    add_head_shape(p)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--repeat", type=int, default=200, help="timed calls per path, over 5 rounds")
    return p.parse_args(argv)


def cases(a: argparse.Namespace, t: int, native: cpu_fused.NativeFused) -> list[tuple[str, Op, Op, int]]:
    """(name, C call, reference call, bytes the op must move) for T = t rows."""
    h, i, hd, heads = a.hidden, a.intermediate, a.head_dim, a.heads + a.kv_heads
    x, residual, w = torch.randn(t, h), torch.randn(t, h), torch.randn(h)
    gate_up = torch.randn(t, 2 * i)
    qkv = torch.randn(t, (heads + a.kv_heads) * hd)
    qk = qkv[:, : heads * hd].view(t, heads, hd)
    cos, sin = torch.randn(t, 1, hd), torch.randn(t, 1, hd)
    logits = torch.randn(min(t, 64), a.vocab)  # sampled rows: one per request, at most 64 here
    f = 4  # float32 bytes
    return [
        ("rms_norm", lambda: native.rms_norm(x, w, 1e-5), lambda: rms_norm_reference(x, w, 1e-5), 2 * t * h * f),
        # in place on the same buffers every call: values drift, the cost does not
        ("add + rms_norm", lambda: native.add_rms_norm_(x, residual, w, 1e-5),
         lambda: fused_add_rms_norm_reference(x, residual, w, 1e-5), 4 * t * h * f),
        ("silu_and_mul", lambda: native.silu_and_mul(gate_up), lambda: silu_and_mul_reference(gate_up), 3 * t * i * f),
        ("rotary q|k", lambda: native.rotary_(qk, cos, sin), lambda: rotary_reference(qk, cos, sin),
         2 * t * heads * hd * f + 2 * t * hd * f),
        ("argmax (N<=64)", lambda: native.argmax(logits), lambda: logits.argmax(-1), logits.numel() * f),
    ]


def median_us(fn: Op, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    native = cpu_fused.load()
    if native is None:
        print("the C kernels are unavailable (no compiler, or PAGESERVE_NATIVE_KERNELS=0)")
        return 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32; best of 5 rounds of medians")
    print(f"{'op':<16}{'T':>6}{'C us':>10}{'torch us':>10}{'speed-up':>10}{'C GB/s':>9}")
    for t in a.rows:
        for name, fused, reference, nbytes in cases(a, t, native):
            fused(), reference()  # warm-up
            c_us, ref_us = [], []
            for _ in range(5):  # interleaved rounds
                c_us.append(median_us(fused, a.repeat // 5 or 1))
                ref_us.append(median_us(reference, a.repeat // 5 or 1))
            c, ref = min(c_us), min(ref_us)
            print(f"{name:<16}{t:>6}{c:>10.1f}{ref:>10.1f}{ref / c:>9.2f}x{nbytes / c / 1e3:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
