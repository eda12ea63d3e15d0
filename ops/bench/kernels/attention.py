"""Decode-attention benchmark for a GPU machine: correctness first, then bandwidth.

    python -m ops.bench.kernels.attention                  # H100/H200: under 5 minutes, one table last
    python -m ops.bench.kernels.attention --json out.json  # the same rows as JSON
    python -m ops.bench.kernels.attention --dry-run        # CPU: tiny grid through the Triton interpreter

Decode attention reads every cached key and value once, so its floor is the KV
bytes over the memory bandwidth. The table reports, per batch x context:
achieved GB/s (KV + query + output bytes over the kernel time), that as a share
of the device's measured copy bandwidth (a large torch copy: read + write bytes
over its time), and PyTorch's scaled_dot_product_attention on the same keys and
values gathered into contiguous (B, n_kv, S, hd) tensors (gather not timed).
Target on an H100/H200: >= 80% of copy bandwidth for contexts >= 2k.
This file is a script, not a test; tests/ops/bench/kernels/test_attention.py runs --dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

GPU_GRID = ((1, 32768), (4, 16384), (16, 8192), (64, 2048), (128, 1024), (256, 512), (32, 4096))
DRY_GRID = ((1, 300), (3, 64))
DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Row:
    batch: int
    context: int
    num_splits: int
    triton_us: float
    triton_gbps: float
    pct_of_copy: float
    sdpa_us: float
    sdpa_gbps: float
    max_err: float


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.attention", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=DTYPES, default="float16")
    p.add_argument("--n-q", type=int, default=None, help="query heads (default: Llama-3-8B's 32; dry run 4)")
    p.add_argument("--n-kv", type=int, default=None, help="KV heads (default 8; dry run 2)")
    p.add_argument("--head-dim", type=int, default=None, help="(default 128; dry run 64)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--grid", default=None, help="comma list of BxS, e.g. 1x32768,64x2048")
    p.add_argument("--tile-n", type=int, default=None, help="override the kernel's KV tile")
    p.add_argument("--num-warps", type=int, default=None, help="override the kernel's warps")
    p.add_argument("--num-stages", type=int, default=3, help="software pipelining depth")
    p.add_argument("--sweep", action="store_true", help="first try tile/warps/stages on 1x32k and 64x2k")
    p.add_argument("--json", dest="json_path", default=None, help="also write the rows here")
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny grid")
    args = p.parse_args(argv)
    small = args.dry_run
    args.n_q = args.n_q or (4 if small else 32)
    args.n_kv = args.n_kv or (2 if small else 8)
    args.head_dim = args.head_dim or (64 if small else 128)
    return args


def grid_of(args: argparse.Namespace) -> tuple[tuple[int, int], ...]:
    if args.grid:
        return tuple((int(b), int(s)) for b, s in (item.split("x") for item in args.grid.split(",")))
    return DRY_GRID if args.dry_run else GPU_GRID


def timer(device: str) -> Callable[[Callable[[], object]], float]:
    """Mean seconds per call of fn.

    On CUDA the calls are captured in a CUDA graph and replayed
    (triton.testing.do_bench_cudagraph): a 1 x 32k decode reads 128 MiB in about
    30 us, less than the Python launcher's own overhead, which a serving engine
    also hides behind a graph. Elsewhere (the interpreter) a plain loop.
    """
    import triton.testing

    if device == "cuda":
        return lambda fn: triton.testing.do_bench_cudagraph(fn, rep=100) / 1e3

    def loop(fn: Callable[[], object]) -> float:
        fn()  # warm-up
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return loop


def copy_bandwidth(device: str, bench: Callable[[Callable[[], object]], float]) -> float:
    """Bytes per second of a large device copy, counting the read and the write (gpu_check's yardstick:
    on CUDA timed plainly, not in a graph, where the copy engines would run it slower than the SMs)."""
    import torch

    if device == "cuda":
        from ops.gpu_check.kernel_timing import copy_bandwidth_gbs

        return copy_bandwidth_gbs(torch.device("cuda"), 1024, 20) * 1e9
    src = torch.empty(1 << 22, dtype=torch.float32, device=device).uniform_()  # 16 MiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / bench(lambda: dst.copy_(src))


def decode_batch(batch: int, context: int, args: argparse.Namespace, device: str):
    """Random decode batch: every request at `context` tokens, blocks scattered over the pool."""
    import torch

    dtype = getattr(torch, args.dtype)
    bs = args.block_size
    per_seq = -(-context // bs)
    num_blocks = batch * per_seq + 1
    table = torch.randperm(num_blocks, device=device)[: batch * per_seq].view(batch, per_seq).int()
    shape = (num_blocks, bs, args.n_kv, args.head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    query = torch.randn(batch, args.n_q, args.head_dim, dtype=dtype, device=device)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return query, k_cache, v_cache, table, qsl, seq_lens, args.head_dim**-0.5


def check_correctness(args: argparse.Namespace, device: str) -> float:
    """Mixed prefill/decode batches against the float64 reference; raises on a mismatch."""
    import torch

    from pageserve_kernels.paged_attention import paged_attention
    from pageserve_kernels.reference import paged_attention_ref

    tol = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}[args.dtype]
    worst = 0.0
    cases = [([1, 1, 1], [1, 17, 1023]), ([5, 1, 33], [40, 700, 33])]
    if device == "cpu":  # the interpreter is slow: one small mixed batch
        cases = [([1, 3], [70, 20])]
    for q_lens, seq_lens in cases:
        q, kc, vc, table, _, _, scale = decode_batch(len(q_lens), max(seq_lens), args, device)
        q = torch.randn(sum(q_lens), *q.shape[1:], dtype=q.dtype, device=device)
        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        sl = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        ref = paged_attention_ref(q.double(), kc.double(), vc.double(), table, qsl, sl, scale)
        for splits in (None, 3):
            out = torch.full_like(q, float("nan"))
            paged_attention(q, kc, vc, table, qsl, sl, scale, out=out, num_splits=splits)
            err = float((out.double() - ref).abs().max())
            if not err <= tol:  # also catches NaN
                raise SystemExit(f"correctness check failed: max error {err} > {tol} (splits={splits})")
            worst = max(worst, err)
    return worst


@dataclass(frozen=True)
class LaunchOptions:
    tile_n: int | None = None
    num_warps: int | None = None
    num_stages: int = 3


def kernel_options(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(args.tile_n, args.num_warps, args.num_stages)


def sweep(args: argparse.Namespace, device: str, bench, copy_bps: float) -> None:
    """Time a few launch configurations on two shapes; print the best of each (tuning aid)."""
    shapes = ((2, 64), (3, 48)) if args.dry_run else ((1, 32768), (64, 2048))
    # stages >= 5 is where Triton 3.9 double-buffers the block-table-indirect K/V loads
    configs = [(32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 8, 3), (32, 4, 5), (64, 4, 5)]
    if args.dry_run:
        configs = configs[:2]
    for batch, context in shapes:
        results = []
        for tile_n, warps, stages in configs:
            opts = LaunchOptions(tile_n, warps, stages)
            row = measure(batch, context, args, device, bench, copy_bps, opts, with_sdpa=False)
            results.append((row.pct_of_copy, tile_n, warps, stages))
            print(f"  sweep {batch}x{context} tile_n={tile_n} warps={warps} stages={stages}: "
                  f"{row.pct_of_copy:.1f}% of copy", flush=True)  # fmt: skip
        best = max(results)
        print(f"  best {batch}x{context}: tile_n={best[1]} num_warps={best[2]} num_stages={best[3]}")


def measure(
    batch: int,
    context: int,
    args: argparse.Namespace,
    device: str,
    bench: Callable[[Callable[[], object]], float],
    copy_bps: float,
    options: LaunchOptions,
    with_sdpa: bool = True,
) -> Row:
    import torch

    from pageserve_kernels.attention_launch import choose_num_splits
    from pageserve_kernels.paged_attention import paged_attention

    query, k_cache, v_cache, table, qsl, seq_lens, scale = decode_batch(batch, context, args, device)
    out = torch.empty_like(query)

    def run() -> object:
        return paged_attention(
            query, k_cache, v_cache, table, qsl, seq_lens, scale,
            max_query_len=1, max_seq_len=context, out=out, tile_n=options.tile_n,
            num_warps=options.num_warps, num_stages=options.num_stages,
        )  # fmt: skip

    t_triton = bench(run)
    # the floor: every key and value read once, the queries read and the outputs written once
    io_bytes = (2 * batch * context * args.n_kv + 2 * query.numel() // args.head_dim) * args.head_dim
    io_bytes *= query.element_size()
    t_sdpa, err = (
        bench_sdpa(query, k_cache, v_cache, table, context, scale, bench, run) if with_sdpa else (0.0, 0.0)
    )
    return Row(
        batch=batch,
        context=context,
        num_splits=choose_num_splits(batch * args.n_kv, context, query.device),
        triton_us=t_triton * 1e6,
        triton_gbps=io_bytes / t_triton / 1e9,
        pct_of_copy=100 * io_bytes / t_triton / copy_bps,
        sdpa_us=t_sdpa * 1e6,
        sdpa_gbps=io_bytes / t_sdpa / 1e9 if t_sdpa else 0.0,
        max_err=err,
    )


def bench_sdpa(query, k_cache, v_cache, table, context: int, scale: float, bench, run) -> tuple[float, float]:
    """SDPA seconds on the same data gathered contiguous, and its max difference from `run()`."""
    import torch
    import torch.nn.functional as F

    from pageserve_kernels.reference import gather_kv_ref

    batch = query.shape[0]
    k = torch.stack([gather_kv_ref(k_cache, table[b], context) for b in range(batch)])  # (B, S, n_kv, hd)
    v = torch.stack([gather_kv_ref(v_cache, table[b], context) for b in range(batch)])
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # (B, n_kv, S, hd)
    q4 = query.unsqueeze(2)  # (B, n_q, 1, hd)
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True))
    sdpa_out = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True).squeeze(2)
    return t_sdpa, float((run().float() - sdpa_out.float()).abs().max())


def table(rows: list[Row], copy_bps: float, header: str) -> str:
    lines = [
        header,
        f"measured copy bandwidth: {copy_bps / 1e9:.0f} GB/s (read + write)",
        f"{'batch':>6} {'context':>8} {'splits':>6} {'triton us':>10} {'GB/s':>7} {'% copy':>7} "
        f"{'sdpa us':>9} {'GB/s':>7} {'|tri-sdpa|':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r.batch:>6} {r.context:>8} {r.num_splits:>6} {r.triton_us:>10.1f} {r.triton_gbps:>7.0f} "
            f"{r.pct_of_copy:>6.1f}% {r.sdpa_us:>9.1f} {r.sdpa_gbps:>7.0f} {r.max_err:>10.2e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before kernels.* is imported below
    import torch

    if args.dry_run:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        print("no CUDA device: run on a GPU machine, or use --dry-run", file=sys.stderr)
        return 2
    from pageserve_kernels.dispatch import select_backend

    select_backend("triton", device)  # fails clearly if the interpreter was not switched on in time
    torch.manual_seed(0)
    started = time.perf_counter()
    worst = check_correctness(args, device)
    print(f"correctness: ok (max error vs float64 reference {worst:.2e})", flush=True)
    bench = timer(device)
    copy_bps = copy_bandwidth(device, bench)
    if args.sweep:
        sweep(args, device, bench, copy_bps)
    rows = []
    for batch, context in grid_of(args):
        rows.append(measure(batch, context, args, device, bench, copy_bps, kernel_options(args)))
        print(f"  done {batch}x{context} ({time.perf_counter() - started:.0f} s)", flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter: timings meaningless)"
    header = (
        f"decode paged attention, {args.dtype}, n_q={args.n_q} n_kv={args.n_kv} hd={args.head_dim} "
        f"block={args.block_size}, {name}"
    )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"header": header, "copy_gbps": copy_bps / 1e9, "rows": [asdict(r) for r in rows]}, f)
    print(table(rows, copy_bps, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
