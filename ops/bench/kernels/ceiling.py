"""What this CPU can give the engine at best: arithmetic peak, achieved products, memory bandwidth,
and the standard offline workload's floor that follows from them, for one model's shapes.

    python -m ops.bench.kernels.ceiling            # SmolLM2-135M, float32, torch's thread count
    python -m ops.bench.kernels.ceiling --threads 1
    python -m ops.bench.kernels.ceiling --model /path/to/llama-3.2-1b --dtype bfloat16

Prints, side by side in one run:
  - the arithmetic peak, operands in registers: float32 FMA (ten independent chains), or for
    bfloat16 the AVX512-BF16 dot product (twelve chains; n/a where the CPU lacks it: AMX's tiles
    are not measured here, so on an AMX host this is a lower bound of the peak);
  - oneDNN-packed and plain F.linear products at the model's shapes (`--model FOLDER`: any
    supported Hugging Face folder, e.g. `pageserve bench make-model`'s);
  - streaming read bandwidth (sum of a 1 GiB tensor);
  - the workload's matmul FLOPs and KV bytes read by decode attention, and the
    seconds and output tok/s they cost at the best rates measured above (a floor
    that ignores prompt attention, elementwise ops and Python).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.worker.models.spec import ModelSpec
from pageserve_kernels import native_build

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
#if (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

/* GFLOP/s of `iters` rounds of ten independent FMA chains per thread, operands in
   registers: the float32 peak. Returns 0 without AVX2+FMA. */
double fma_gflops(int64_t iters, int nthreads) {
#if defined(__AVX2__) && defined(__FMA__)
    double t0 = omp_get_wtime();
    float sink = 0.f;
#pragma omp parallel num_threads(nthreads) reduction(+ : sink)
    {
        const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
        /* distinct starting values: chains the compiler cannot merge into fewer */
#define START(i) _mm256_set1_ps(1.0f + 0.01f * (i))
        __m256 a0 = START(0), a1 = START(1), a2 = START(2), a3 = START(3), a4 = START(4),
               a5 = START(5), a6 = START(6), a7 = START(7), a8 = START(8), a9 = START(9);
        for (int64_t i = 0; i < iters; i++) {
            a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c); a2 = _mm256_fmadd_ps(a2, m, c);
            a3 = _mm256_fmadd_ps(a3, m, c); a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
            a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c); a8 = _mm256_fmadd_ps(a8, m, c);
            a9 = _mm256_fmadd_ps(a9, m, c);
        }
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
        s = _mm256_add_ps(s, _mm256_add_ps(a8, a9));
        float lanes[8];
        _mm256_storeu_ps(lanes, s);
        sink += lanes[0];
    }
    double t = omp_get_wtime() - t0;
    return (sink == -1.f ? 1.0 : 0.0) + nthreads * (double)iters * 10 * 16 / t / 1e9;
#else
    (void)iters; (void)nthreads;
    return 0.0;
#endif
}

/* GFLOP/s of twelve independent AVX512-BF16 dot-product chains per thread (each instruction: 16 lanes
   x 2 products x 2 FLOP): the bfloat16 peak without AMX. Returns 0 without AVX512-BF16. */
double bf16_dot_gflops(int64_t iters, int nthreads) {
#if defined(__AVX512BF16__)
    double t0 = omp_get_wtime();
    float sink = 0.f;
#pragma omp parallel num_threads(nthreads) reduction(+ : sink)
    {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
#define ZERO(i) __m512 s##i = _mm512_set1_ps(0.001f * (i));
#define DOT(i) s##i = _mm512_dpbf16_ps(s##i, x, y);
#define TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
        TWELVE(ZERO)
        for (int64_t i = 0; i < iters; i++) {
            TWELVE(DOT)
        }
#define SUM(i) + _mm512_reduce_add_ps(s##i)
        sink += 0.f TWELVE(SUM);
    }
    double t = omp_get_wtime() - t0;
    return (sink == -1.f ? 1.0 : 0.0) + nthreads * (double)iters * 12 * 64 / t / 1e9;
#else
    (void)iters; (void)nthreads;
    return 0.0;
#endif
}
"""

# SmolLM2-135M, the default model (numbers from its config.json)
SMOLLM2 = ModelSpec(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                     num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None,
                     tie_word_embeddings=True, attention_bias=False, max_position_embeddings=8192)


def product_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """One layer's products as (K, N), and the vocabulary product."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {"qkv": (spec.hidden_size, q + 2 * kv), "o": (q, spec.hidden_size),
            "gate_up": (spec.hidden_size, 2 * spec.intermediate_size), "down": (spec.intermediate_size, spec.hidden_size),
            "vocab": (spec.hidden_size, spec.vocab_size)}


def model_spec(folder: str | None) -> tuple[str, ModelSpec]:
    if folder is None:
        return "SmolLM2-135M", SMOLLM2
    from engine.worker.models.architectures import read_spec

    return Path(folder).name, read_spec(json.loads((Path(folder) / "config.json").read_text()))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=None, help="torch and OpenMP threads (default: torch's choice)")
    p.add_argument("--rows", type=int, nargs="+", default=[64, 2048], help="M: tokens in the step")
    p.add_argument("--model", default=None, help="a Hugging Face folder whose shapes to use (default SmolLM2-135M)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    return p.parse_args(argv)


def best_seconds(fn: Callable[[], object], repeat: int = 5, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def arithmetic_peak(threads: int, dtype: torch.dtype) -> float | None:
    """GFLOP/s of the float32 FMA or the bfloat16 dot product in registers; None where the CPU lacks it."""
    lib = native_build.try_load("ceiling", SOURCE, native_build.EXACT_FLAGS)  # no reassociated chains
    if lib is None:
        return None
    fn = lib.fma_gflops if dtype == torch.float32 else lib.bf16_dot_gflops
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_int64, ctypes.c_int]
    peak = max(fn(50_000_000, threads) for _ in range(3))
    return peak if peak > 0 else None


def gemm_rates(spec: ModelSpec, rows: list[int], dtype: torch.dtype) -> dict[tuple[str, int], tuple[float, float]]:
    """(shape name, M) -> (oneDNN-packed GFLOP/s, F.linear GFLOP/s)."""
    out = {}
    for name, (k, n) in product_shapes(spec).items():
        w = torch.randn(n, k, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 64) if torch.backends.mkldnn.is_available() else None
        for m in rows if name != "vocab" else [r for r in rows if r <= 64]:
            x = torch.randn(m, k, dtype=dtype)
            flops = 2 * m * k * n
            plain = flops / best_seconds(lambda x=x, w=w: F.linear(x, w)) / 1e9
            fast = 0.0 if packed is None else flops / best_seconds(
                lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")) / 1e9
            out[(name, m)] = (fast, plain)
    return out


def stream_read_gbs() -> float:
    x = torch.ones(256 << 20)  # 1 GiB of float32
    return x.numel() * 4 / best_seconds(lambda: x.sum(), repeat=1, rounds=5) / 1e9


def workload_cost(spec: ModelSpec, dtype: torch.dtype) -> tuple[float, float, int]:
    """(matmul FLOPs, KV bytes read by decode attention, output tokens) of the standard offline workload."""
    from ops.bench.offline import make_workload

    w = make_workload(64, (32, 512), (16, 256), min(spec.vocab_size, SMOLLM2.vocab_size), 0)
    fed = sum(len(p) + n - 1 for p, n in zip(w.prompts, w.output_lens, strict=True))
    flops = fed * spec.flops_per_token() + w.output_tokens * 2 * spec.hidden_size * spec.vocab_size
    kv_per_token = spec.kv_bytes_per_token(dtype)
    # the decode step that makes output token j (j = 1 .. n-1; token 0 comes from the prompt step)
    # reads the K and V of the prompt and of j tokens
    kv_tokens = sum((n - 1) * len(p) + n * (n - 1) // 2 for p, n in zip(w.prompts, w.output_lens, strict=True))
    return flops, kv_tokens * kv_per_token, w.output_tokens


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    threads, dtype = torch.get_num_threads(), getattr(torch, a.dtype)
    name, spec = model_spec(a.model)
    print(f"torch {torch.__version__}, {threads} threads, {a.dtype}, {name}'s shapes")
    peak = arithmetic_peak(threads, dtype)
    what = "float32 FMA" if dtype == torch.float32 else "AVX512-BF16 dot product"
    print(f"{what} peak: n/a (the CPU lacks it, no C compiler, or PAGESERVE_NATIVE_KERNELS=0)" if peak is None
          else f"{what} peak (registers only)  {peak:8.1f} GFLOP/s")
    rates = gemm_rates(spec, a.rows, dtype)
    print(f"\n{'product':<10}{'M':>6}{'oneDNN-packed':>15}{'F.linear':>10}  GFLOP/s")
    for (name, m), (fast, plain) in rates.items():
        share = f"  (best {100 * max(fast, plain) / peak:.0f}% of peak)" if peak else ""
        print(f"{name:<10}{m:>6}{fast:>15.1f}{plain:>10.1f}{share}")
    bw = stream_read_gbs()
    print(f"\nstreaming read (sum of 1 GiB)     {bw:8.1f} GB/s")
    flops, kv_bytes, out_tokens = workload_cost(spec, dtype)
    best_gemm = max(max(r) for r in rates.values())
    mm_s, kv_s = flops / best_gemm / 1e9, kv_bytes / bw / 1e9
    print(f"\nstandard offline workload: {flops / 1e12:.2f} TFLOP of products, {kv_bytes / 1e9:.0f} GB of KV read "
          f"by decode attention, {out_tokens} output tokens")
    print(f"  products at the best rate above ({best_gemm:.0f} GFLOP/s): {mm_s:.1f} s")
    print(f"  KV reads at streaming bandwidth ({bw:.0f} GB/s): {kv_s:.1f} s")
    print(f"  floor {mm_s + kv_s:.1f} s: at most {out_tokens / (mm_s + kv_s):.0f} output tok/s "
          "(prompt attention, elementwise ops and Python not counted)")
    if peak:
        print(f"  products at the arithmetic peak ({peak:.0f} GFLOP/s): {flops / peak / 1e9:.1f} s, at most "
              f"{out_tokens / (flops / peak / 1e9):.0f} output tok/s whatever the kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
