"""SparseMoE forward: tokens grouped by expert against a per-token loop, on the CPU. A script, not a test.

    python -m ops.bench.kernels.moe                 # Qwen3-MoE-like small shape, 1-2 minutes on 2 cores
    python -m ops.bench.kernels.moe --rows 1 16     # fewer row counts
    python -m ops.bench.kernels.moe --threads 1     # one thread: steadier on a shared host
    python -m ops.bench.kernels.moe --dtype float32 # one dtype: half the time

Shape: hidden 1024, expert intermediate 768, 16 experts, top 4 (an expert's gate_up and down are
4.7 MiB in bfloat16). "grouped" is engine/worker/layers/moe.py as the engine runs it unpacked,
"packed" after pack_weights() (each expert's products through engine/worker/layers/linear.py's
per-host choice), "per-token" runs each (token, expert) pair as its own two products: the same
arithmetic, each expert's weights read once per token instead of once per step.
Each cell is the median of repeated calls (fewer for the slow per-token loop at many rows). The first
run on a host also times linear.py's candidates for the two expert shapes (cached per host afterwards).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from engine.worker.layers.moe import SparseMoE
from pageserve_kernels.fused_ops import silu_and_mul

H, INTER, E, K = 1024, 768, 16, 4


def per_token(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H): the ungrouped baseline
    weights, experts = moe.route(x)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), experts[t].tolist(), strict=True):
            h = silu_and_mul(torch.nn.functional.linear(x[t: t + 1], moe.experts_gate_up[e]))  # (1, I)
            out[t] += w * torch.nn.functional.linear(h, moe.experts_down[e])[0].float()
    return out.to(x.dtype)


def _median_s(fn: Callable[[], object], budget_s: float = 0.5, most: int = 20) -> float:
    fn()  # warm
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < most and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _moe(dtype: torch.dtype) -> SparseMoE:
    g = torch.Generator().manual_seed(0)
    moe = SparseMoE(H, INTER, E, K, norm_topk_prob=True, dtype=dtype)
    for p in moe.parameters():
        p.data = (torch.randn(p.shape, generator=g) * 0.05).to(dtype)
    return moe


def _row(plain: SparseMoE, packed: SparseMoE, rows: int, dtype: torch.dtype) -> str:
    x = torch.randn(rows, H, generator=torch.Generator().manual_seed(rows)).to(dtype)
    torch.testing.assert_close(per_token(plain, x).float(), plain(x).float(), atol=5e-2, rtol=5e-2)
    g, p = _median_s(partial(plain, x)), _median_s(partial(packed, x))
    n = _median_s(partial(per_token, plain, x), most=10 if rows < 256 else 2)
    name = str(dtype).removeprefix("torch.")
    return f"{name:>9} {rows:>5} {g * 1e3:>11.2f} {p * 1e3:>10.2f} {n * 1e3:>13.2f} {n / g:>19.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 512])
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; H {H}, I {INTER}, {E} experts, top {K}")
    print(f"{'dtype':>9} {'rows':>5} {'grouped ms':>11} {'packed ms':>10} {'per-token ms':>13} {'per-token / grouped':>20}")
    with torch.no_grad():
        for dtype in (getattr(torch, name) for name in args.dtype):
            plain, packed = _moe(dtype), _moe(dtype)
            packed.pack_weights()
            for rows in args.rows:
                print(_row(plain, packed, rows, dtype))


if __name__ == "__main__":
    main()
