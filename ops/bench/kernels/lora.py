"""LoRA on a GPU: the Triton shrink + expand (one launch each for every adapter of a step) against PyTorch.

    python -m ops.bench.kernels.lora                    # CUDA: Llama-3-8B's projections, about a minute
    python -m ops.bench.kernels.lora --json out.json    # the same rows as JSON
    python -m ops.bench.kernels.lora --dry-run          # CPU: tiny shapes through the Triton interpreter

Per projection (qkv with its q/k/v slices, o, gate_up with two slices, down), step rows (decode: one per
request, a quarter of them base rows; prompt: long chunks), adapters and rank: engine/worker/lora/
device_weights.py's GpuLoraStep.add (the two kernels) against batch.py's LoraBatch.add on the same device
(two products per adapter group and slice: the reference). Both are timed as the engine runs them, eager
launches with their host overhead. GB/s counts the bytes the pair must move at least (the adapter rows of
x, each adapter's A and B once, those rows of out read and written); GFLOP/s the LoRA products. A decode
step is memory-bound: A and B dominate, so GB/s against the device's copy bandwidth is the yardstick.
Correctness against the reference first. A script, not a test (tests/ops/bench/kernels/test_lora.py
runs --dry-run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace

LLAMA_8B = (4096, 4096, 1024, 14336)  # hidden, q width, kv width, intermediate
TINY = (123, 96, 32, 200)
GPU_CASES = ((16, 4, 16), (64, 8, 16), (256, 16, 16), (64, 4, 64), (2048, 4, 16))  # (rows, adapters, rank)
DRY_CASES = ((9, 2, 8),)
PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Row:
    projection: str
    rows: int
    adapters: int
    rank: int
    triton_us: float
    triton_gbps: float
    triton_gflops: float
    torch_us: float
    torch_gbps: float
    speedup: float
    max_err: float


def layout(shape: tuple[int, int, int, int]) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """projection -> (input width, output slices), the fused layout of engine/worker/lora/adapter.py."""
    h, q, kv, inter = shape
    return {"qkv": (h, [(0, q), (q, q + kv), (q + kv, q + 2 * kv)]), "o": (q, [(0, h)]),
            "gate_up": (h, [(0, inter), (inter, 2 * inter)]), "down": (inter, [(0, h)])}


def make_adapters(count: int, rank: int, shape, dtype, device):  # type: ignore[no-untyped-def]
    """`count` random one-layer adapters of `rank` on every target of every projection, load ids 1..count."""
    import torch

    from engine.worker.lora.adapter import LoraAdapter, LoraSlice, ProjectionLora

    out = {}
    for load_id in range(1, count + 1):
        projections = {}
        for name, (width, slices) in layout(shape).items():
            parts = [LoraSlice(s, e, i * rank, (i + 1) * rank,
                               (torch.randn(e - s, rank, device=device) / rank).to(dtype))
                     for i, (s, e) in enumerate(slices)]
            a = (torch.randn(len(slices) * rank, width, device=device) / width**0.5).to(dtype)
            projections[name] = ProjectionLora(a, tuple(parts))
        out[load_id] = LoraAdapter(f"bench-{load_id}", "", load_id, rank, (projections,))
    return out


def step_rows(rows: int, adapters: int) -> list[int]:
    """The adapter of each row (0: base): requests interleaved, every fourth row a base row."""
    return [0 if i % 4 == 3 else 1 + i % adapters for i in range(rows)]


def moved_bytes_and_flops(ids: list[int], rank: int, width: int, slices: list[tuple[int, int]],
                          elem: int) -> tuple[int, int]:
    """The least bytes a step's LoRA term moves (adapter rows of x; each adapter's A and B once; those rows
    of out read and written) and its multiply-adds x 2."""
    m, n_out, adapters = sum(1 for i in ids if i), sum(e - s for s, e in slices), len(set(ids) - {0})
    weights = adapters * sum(rank * width + (e - s) * rank for s, e in slices)
    moved = (m * width + 2 * m * n_out + weights) * elem
    flops = 2 * m * len(slices) * rank * width + 2 * m * n_out * rank
    return moved, flops


def measure(projection: str, rows: int, adapters: int, rank: int, args, device) -> Row:  # type: ignore[no-untyped-def]
    import torch

    from engine.worker.lora.batch import build_lora_batch
    from engine.worker.lora.device_weights import LoraSlots, plan_gpu_step
    from ops.gpu_check.kernel_timing import plain_ms

    dtype, shape = getattr(torch, args.dtype), TINY if args.dry_run else LLAMA_8B
    width, slices = layout(shape)[projection]
    loras = make_adapters(adapters, rank, shape, dtype, device)
    ids = step_rows(rows, adapters)
    by_id: dict[int, list[int]] = {}
    for row, lora_id in enumerate(ids):
        if lora_id:
            by_id.setdefault(lora_id, []).append(row)
    reference = build_lora_batch([1] * rows, ids, loras, device)
    assert reference is not None
    reference = replace(reference, gpu=None)  # the per-group PyTorch path, on this device
    step = plan_gpu_step(by_id, loras, LoraSlots(), device)
    x = torch.randn(rows, width, device=device).to(dtype)
    out = torch.randn(rows, slices[-1][1], device=device).to(dtype)
    got, want = out.clone(), out.clone()
    step.add(got, x, 0, projection)
    reference.add(want, x, 0, projection)
    err = float((got.float() - want.float()).abs().max())
    repeats = 1 if args.dry_run else args.repeats
    t_triton = plain_ms(lambda: step.add(got, x, 0, projection), device, repeats) / 1e3
    t_torch = plain_ms(lambda: reference.add(want, x, 0, projection), device, repeats) / 1e3
    moved, flops = moved_bytes_and_flops(ids, rank, width, slices, x.element_size())
    return Row(projection, rows, adapters, rank, t_triton * 1e6, moved / t_triton / 1e9, flops / t_triton / 1e9,
               t_torch * 1e6, moved / t_torch / 1e9, t_torch / t_triton, err)


def table(rows: list[Row], header: str) -> str:
    lines = [header, f"{'proj':>8} {'rows':>5} {'loras':>5} {'rank':>4} {'triton us':>10} {'GB/s':>7} "
                     f"{'GFLOP/s':>8} {'torch us':>9} {'GB/s':>7} {'speedup':>7} {'max err':>8}"]
    for r in rows:
        lines.append(f"{r.projection:>8} {r.rows:>5} {r.adapters:>5} {r.rank:>4} {r.triton_us:>10.1f} "
                     f"{r.triton_gbps:>7.0f} {r.triton_gflops:>8.0f} {r.torch_us:>9.1f} {r.torch_gbps:>7.0f} "
                     f"{r.speedup:>6.1f}x {r.max_err:>8.1e}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.bench.kernels.lora", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--projections", nargs="+", choices=PROJECTIONS, default=list(PROJECTIONS))
    p.add_argument("--repeats", type=int, default=50, help="timed calls per cell (median)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the rows here")
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or use --dry-run", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    tol = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}[args.dtype]
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for rows, adapters, rank in DRY_CASES if args.dry_run else GPU_CASES:
            for projection in args.projections:
                row = measure(projection, rows, adapters, rank, args, device)
                if not row.max_err <= tol:  # NaN fails too
                    print(f"correctness check failed: {row}", file=sys.stderr)
                    return 1
                results.append(row)
    print(f"correctness: ok (every cell within {tol} of LoraBatch's PyTorch path)")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter: timings meaningless)"
    header = f"LoRA shrink + expand, {args.dtype}, shapes {'tiny' if args.dry_run else 'Llama-3-8B'}, {name}"
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"header": header, "rows": [asdict(r) for r in results]}, f)
    print(table(results, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
