"""Kernel timings on the checked device: decode attention against copy bandwidth, prefill warps.

Decode attention reads every cached K and V byte of the batch once, so its
ceiling is the device's memory bandwidth; the yardstick is a measured
device-to-device copy (read + write bytes per second), the practical peak.
The target: decode attention at >= 80% of it for contexts of 2k and longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

HEADS = (32, 8, 128)
"""(n_q, n_kv, head_dim) of the timed launches: a Llama-3-8B layer; --tiny uses TINY_HEADS."""
TINY_HEADS = (4, 2, 32)


def timed_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of one fn() on the device.

    On CUDA the calls are captured in a CUDA graph and replayed (triton.testing.do_bench_cudagraph),
    as the engine replays its decode steps: a 1 x 32k decode reads 128 MiB in about 40 us, less than
    the Python launcher's own overhead, so timing single launches between events measured the host
    (0.22 ms against 0.044 ms on an H200). Elsewhere (the interpreter) the median of `repeats` runs.
    """
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench_cudagraph(fn, rep=max(20, 5 * repeats), return_mode="median"))
    return plain_ms(fn, device, repeats)


def plain_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of fn() launched plainly, `repeats` times after one warm-up run: between
    events on CUDA, by the host's clock elsewhere."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(device: torch.device, mib: int, repeats: int) -> float:
    """Read + write GB/s of a large device copy: the practical bandwidth peak, the yardstick of decode attention.

    Timed plainly, never in a graph: a captured device-to-device copy becomes a memcpy node that the
    copy engines run, about 2.8 TB/s on an H200 against 4.1 TB/s for the same copy launched plainly,
    which would flatter every kernel measured against it.
    """
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = plain_ms(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() / (ms * 1e6)


def decode_case(batch: int, context: int, n_q: int, n_kv: int, hd: int, block_size: int, dtype: torch.dtype,
                device: torch.device) -> tuple[Callable[[], object], int]:
    """A decode launch over `batch` requests of `context` tokens, and the K/V bytes it must read."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, block_size, n_kv, hd, device=device).to(dtype)
    v_cache = torch.randn_like(k_cache)
    # A shuffled table: requests' blocks scattered over the pool, as after a while of serving.
    tables = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
    query = torch.randn(batch, n_q, hd, device=device).to(dtype)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    out = torch.empty_like(query)
    from pageserve_kernels.paged_attention import paged_attention

    def run() -> object:
        return paged_attention(query, k_cache, v_cache, tables, starts, lens, hd**-0.5, max_query_len=1,
                               max_seq_len=context, out=out)

    return run, 2 * batch * context * n_kv * hd * k_cache.element_size()


def check_decode_bandwidth(device: torch.device, grids: list[tuple[int, int]], copy_mib: int, repeats: int,
                           heads: tuple[int, int, int] = HEADS) -> bool:
    copy = copy_bandwidth_gbs(device, copy_mib, repeats)
    n_q, n_kv, hd = heads
    print(f"  device copy bandwidth (read + write): {copy:.2f} GB/s")
    ok = True
    for batch, context in grids:
        run, kv_bytes = decode_case(batch, context, n_q, n_kv, hd, 16, torch.bfloat16, device)
        ms = timed_ms(run, device, repeats)
        gbs = kv_bytes / (ms * 1e6)
        pct = 100 * gbs / copy
        target = context >= 2048 and device.type == "cuda"
        met = "" if not target else ("  target met" if pct >= 80 else "  BELOW the 80% target")
        ok &= not target or pct >= 80
        print(f"  decode attention {batch:>4} x {context:>6} (n_q {n_q}, n_kv {n_kv}, hd {hd}, bf16): {ms:.3f} ms, "
              f"{gbs:.2f} GB/s = {pct:.0f}% of copy{met}")
    return ok


def compare_prefill_warps(device: torch.device, tokens: int, repeats: int,
                          heads: tuple[int, int, int] = HEADS) -> bool:
    """One request's prompt of `tokens` tokens through the large-tile kernel with 4 and 8 warps."""
    from pageserve_kernels.attention_launch import plan_launch
    from pageserve_kernels.paged_attention import paged_attention

    (n_q, n_kv, hd), bs = heads, 16
    blocks = -(-tokens // bs)
    k_cache = torch.randn(blocks, bs, n_kv, hd, device=device).to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.arange(blocks, dtype=torch.int32, device=device)[None, :]
    query = torch.randn(tokens, n_q, hd, device=device).to(torch.bfloat16)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    lens = torch.tensor([tokens], dtype=torch.int32, device=device)
    results = {}
    for warps in (4, 8):
        results[warps] = timed_ms(lambda w=warps: paged_attention(
            query, k_cache, v_cache, tables, starts, lens, hd**-0.5, max_query_len=tokens, max_seq_len=tokens,
            num_warps=w), device, repeats)
    chosen = plan_launch(tokens, 1, n_q, n_kv, hd, tokens, tokens, device).num_warps
    print(f"  prefill of {tokens} tokens (n_q {n_q}, n_kv {n_kv}, hd {hd}, bf16): 4 warps {results[4]:.3f} ms, "
          f"8 warps {results[8]:.3f} ms (the launcher picks {chosen})")
    return True
