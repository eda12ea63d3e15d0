"""Our panel GEMM (pageserve_kernels/cpu_gemm.py) against oneDNN's packed product and F.linear, as a step runs them.

    python -m ops.bench.kernels.gemm                     # SmolLM2-135M shapes, 1..2048 rows
    python -m ops.bench.kernels.gemm --rows 1 8 64
    python -m ops.bench.kernels.gemm --dtype bfloat16    # the AVX512-BF16 kernel (where the CPU has it),
                                                         # and its AMX twin over the same panels ("ours AMX")

One "step" is the four products of every layer (q|k|v, o, gate|up, down), each layer
with its own weights, as the model's forward pass makes them: the weights come
from memory, not from cache, and every call pays its own overhead. Per row count:
milliseconds per step of each path (best of interleaved rounds), GFLOP/s, and our
kernel's speed-up over each. The vocabulary product (one call) is timed apart at
decode row counts. A benchmark, not a test: tests/kernels/test_cpu_gemm.py checks results.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pageserve_kernels import cpu_gemm

Product = Callable[[torch.Tensor, int], torch.Tensor]  # (x, weight index) -> x @ W^T


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.gemm", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 256, 2048], help="M: tokens in the step")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--q-size", type=int, default=576, help="query heads x head size")
    p.add_argument("--kv-size", type=int, default=192, help="KV heads x head size")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    return p.parse_args(argv)


def layer_shapes(a: argparse.Namespace) -> list[tuple[int, int]]:
    """(K, N) of each product of one layer."""
    h = a.hidden
    return [(h, a.q_size + 2 * a.kv_size), (a.q_size, h), (h, 2 * a.intermediate), (a.intermediate, h)]


def paths(weights: list[torch.Tensor], native: cpu_gemm.NativeGemm) -> dict[str, Product]:
    panels = [cpu_gemm.pack_panels(w) for w in weights]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights]
    out: dict[str, Product] = {"ours": lambda x, i: native.linear(x, panels[i])}
    amx = cpu_gemm.load_amx() if native.dtype == torch.bfloat16 else None
    if amx is not None:
        out["ours AMX"] = lambda x, i: amx.linear(x, panels[i])
    out["oneDNN"] = lambda x, i: torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none", [], "")
    out["F.linear"] = lambda x, i: F.linear(x, weights[i])
    return out


def best_ms(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Interleaved rounds, best of each: a busy moment slows one round of every path alike."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    dtype = getattr(torch, a.dtype)
    native = cpu_gemm.load(dtype)
    if native is None:
        print(f"the {a.dtype} panel GEMM is unavailable (float32 needs AVX2+FMA, bfloat16 AVX-512 and AVX512-BF16; "
              "or no C compiler, or PAGESERVE_NATIVE_KERNELS=0)")
        return 1
    shapes = layer_shapes(a)
    weights = [torch.randn(n, k).to(dtype) for _ in range(a.layers) for k, n in shapes]
    step = paths(weights, native)
    vocab = paths([torch.randn(a.vocab, a.hidden).to(dtype)], native)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.dtype}; {a.layers} layers x "
          f"{len(shapes)} products, (K, N) = {shapes}; best of {a.rounds} interleaved rounds")
    names = list(step)
    print(f"{'M':>5} " + "".join(f"{n + ' ms':>13}" for n in names) + "".join(f"{'vs ' + n:>12}" for n in names[1:])
          + f"{'ours GF/s':>11}")

    def run_step(product: Product, xs: dict[int, torch.Tensor]) -> None:
        for i, w in enumerate(weights):
            product(xs[w.shape[1]], i)

    for m in a.rows:
        xs = {k: torch.randn(m, k).to(dtype) for k in {k for k, _ in shapes}}
        ms = best_ms({n: (lambda p=p, xs=xs: run_step(p, xs)) for n, p in step.items()}, a.rounds)
        flops = 2 * m * sum(k * n for k, n in shapes) * a.layers
        print(f"{m:>5} " + "".join(f"{ms[n]:>13.1f}" for n in names)
              + "".join(f"{ms[n] / ms['ours']:>11.2f}x" for n in names[1:]) + f"{flops / ms['ours'] / 1e6:>11.0f}")
    print(f"\nvocabulary product ({a.hidden} -> {a.vocab}), one call")
    for m in [r for r in a.rows if r <= 64]:
        x = torch.randn(m, a.hidden).to(dtype)
        ms = best_ms({n: (lambda p=p, x=x: p(x, 0)) for n, p in vocab.items()}, a.rounds * 3)
        print(f"{m:>5} " + "".join(f"{ms[n]:>13.2f}" for n in names)
              + "".join(f"{ms[n] / ms['ours']:>11.2f}x" for n in names[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
