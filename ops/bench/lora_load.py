"""Issue 43's cold-load must-show: a ~50 MB adapter loads from disk in under 100 ms at the median while
p99 ITL of running streams rises at most 10%.

    python -m ops.bench.lora_load --model smollm2 --dtype bfloat16 --threads 2 [--json load.json]

Writes `--loads` random PEFT folders (ops/bench/lora.py's writer, float32 A and B on all seven
projections, the rank picked so the safetensors file is `--size-mb`), starts `pageserve engine
--enable-lora` (or uses `--engine ADDRESS`), and through the engine's ZeroMQ socket, with the gateway's
own EngineClient (the admin API's path: LoadAdapter -> read on the engine's worker thread -> install on
the step loop -> AdapterReply), runs `--streams` base-model streams (EOS ignored) and measures their
inter-token latencies over a window with no loads (`--baseline-s`) and over the window in which the
adapters are loaded one after another, each timed from the request to the reply. The files are dropped
from the page cache first (posix_fadvise DONTNEED per file, or `--page-cache drop` for
/proc/sys/vm/drop_caches as root), so each load reads from disk; `--page-cache warm` skips that and says so.
One load of an extra adapter before the windows (first use of the reader thread) is reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.engine_client import EngineClient, EngineError, EngineUnavailableError
from shared.protocol import AddRequest, TokenDelta
from shared.sampling import SamplingParams

PAGE_CACHE = {"fadvise": "cold (posix_fadvise DONTNEED per file)", "drop": "cold (drop_caches)",
              "warm": "warm page cache"}


def pick_rank(spec: Any, size_mb: float) -> int:
    """The rank whose float32 adapter on all seven projections of every layer is closest to `size_mb` (1e6 B)."""
    from ops.bench.lora import target_shapes

    per_rank = 4 * spec.num_layers * sum(i + o for i, o in target_shapes(spec).values())
    return max(1, round(size_mb * 1e6 / per_rank))


def write_adapters(folder: Path, spec: Any, rank: int, count: int) -> list[Path]:
    """`count` random adapters, flushed to disk (dirty pages cannot be dropped from the page cache)."""
    from ops.bench.lora import random_adapter

    paths = [random_adapter(folder / f"cold{i}", spec, rank, seed=i) for i in range(count)]
    for path in paths:
        with open(path / "adapter_model.safetensors", "rb+") as f:
            os.fsync(f.fileno())
    return paths


def fs_type(path: Path) -> str:
    """The file system type of the mount holding `path` ("" when /proc/self/mounts is not there)."""
    best, kind, where = "", "", str(path.resolve()) + "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, mount, fs, *_ = line.split()
            if where.startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
                best, kind = mount, fs
    return kind


def evict(paths: list[Path], mode: str) -> str:
    """Drop the adapters' files from the page cache; the label of what was done (PAGE_CACHE's words)."""
    if mode != "warm" and fs_type(paths[0]) in ("tmpfs", "ramfs"):
        return "warm: the files are on tmpfs (memory), no disk read (--dir on a disk)"
    if mode == "drop":
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError:
            mode = "fadvise"  # not root, or a read-only /proc in a container: per file does the same here
    if mode == "fadvise":  # for clean pages (write_adapters flushed them) as good as drop_caches
        for path in paths:
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                fd = os.open(path / name, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    return PAGE_CACHE[mode]


def disk_read_s(path: Path) -> float:
    """One plain sequential read of a file (after `evict`): the floor a cold load of it cannot beat."""
    began = time.perf_counter()
    with open(path / "adapter_model.safetensors", "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - began


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def itls_in(stamps: list[list[float]], t0: float, t1: float) -> list[float]:
    """Gaps between consecutive tokens of each stream whose later token arrived in [t0, t1)."""
    return [b - a for s in stamps for a, b in zip(s, s[1:], strict=False) if t0 <= b < t1]


async def _stream(client: EngineClient, request: AddRequest, stamps: list[float]) -> None:
    stream = await client.submit(request)
    async with stream:
        async for item in stream:
            if isinstance(item, TokenDelta) and item.new_token_ids:
                stamps.append(time.perf_counter())


async def _timed_load(client: EngineClient, name: str, path: Path) -> float:
    began = time.perf_counter()
    reply = await client.load_adapter(name, str(path))
    seconds = time.perf_counter() - began
    if reply.error:
        raise RuntimeError(f"loading {path} failed: {reply.error}")
    return seconds


def _start_streams(client: EngineClient, opts: argparse.Namespace, vocab: int) -> tuple[list, list[list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=opts.output, ignore_eos=True)
    stamps: list[list[float]] = [[] for _ in range(opts.streams)]
    tasks = []
    for i in range(opts.streams):
        prompt = [3 + (i * 131 + j * 17) % (vocab - 3) for j in range(opts.prompt)]
        add = AddRequest(f"lora-load-{i}", prompt, params, arrival_time=time.time())
        tasks.append(asyncio.create_task(_stream(client, add, stamps[i])))
    return tasks, stamps


async def _until_streaming(tasks: list, stamps: list[list[float]], tokens: int, timeout: float = 300.0) -> None:
    deadline = time.perf_counter() + timeout
    while min(len(s) for s in stamps) < tokens:
        if any(t.done() for t in tasks):
            await next(t for t in tasks if t.done())  # its error, if it has one
            raise RuntimeError("a stream ended before the windows began: raise --output")
        if time.perf_counter() > deadline:
            raise RuntimeError(f"streams did not reach {tokens} tokens in {timeout:g} s")
        await asyncio.sleep(0.05)


async def measure(client: EngineClient, warmup: Path, paths: list[Path], opts: argparse.Namespace) -> dict:
    """The two windows on a connected engine; the report without the files' facts."""
    tasks, stamps = _start_streams(client, opts, client.model_info.vocab_size)
    try:
        await _until_streaming(tasks, stamps, opts.warmup_tokens)
        first = await _timed_load(client, "lora-load-warmup", warmup)
        before = await client.stats()
        t0 = time.perf_counter()
        await asyncio.sleep(opts.baseline_s)
        t1 = time.perf_counter()
        loads = [await _timed_load(client, f"lora-load-{i}", path) for i, path in enumerate(paths)]
        t2 = time.perf_counter()
        after = await client.stats()
        if any(t.done() for t in tasks):
            raise RuntimeError("a stream ended inside the windows: raise --output")
    finally:
        for i, task in enumerate(tasks):
            task.cancel()
            with contextlib.suppress(EngineError):
                await client.abort(f"lora-load-{i}")
        await asyncio.gather(*tasks, return_exceptions=True)
    read_s = (after.lora_load_seconds - before.lora_load_seconds) / len(paths)
    return _report(first, loads, read_s, itls_in(stamps, t0, t1), itls_in(stamps, t1, t2), t1 - t0, t2 - t1)


def _report(first: float, loads: list[float], read_s: float, base: list[float], during: list[float],
            base_s: float, during_s: float) -> dict:
    ms = 1000.0
    itl = {name: {"p50_ms": percentile(v, 50) * ms, "p99_ms": percentile(v, 99) * ms, "samples": len(v),
                  "window_s": w}
           for name, v, w in (("baseline", base, base_s), ("during_loads", during, during_s))}
    p99_base = itl["baseline"]["p99_ms"]
    return {
        "loads": len(loads),
        "load_ms": {"median": statistics.median(loads) * ms, "p90": percentile(loads, 90) * ms,
                    "max": max(loads) * ms, "all": [s * ms for s in loads]},
        "first_load_ms": first * ms,
        "engine_read_ms_mean": read_s * ms,
        "itl": itl,
        "p99_rise_pct": (itl["during_loads"]["p99_ms"] / p99_base - 1) * 100 if p99_base else 0.0,
    }


def print_report(report: dict) -> None:
    load, itl = report["load_ms"], report["itl"]
    print(f"{report['model']} {report['dtype']}, {report['streams']} streams decoding, "
          f"adapter file {report['file_mb']:.1f} MB (rank {report['rank']}, float32, 7 projections), "
          f"{report['page_cache']}; a plain read of one such file: {report['disk_read_ms']:.1f} ms")
    print(f"{'loads':>6} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'engine read ms':>15} {'first ms':>9}")
    print(f"{report['loads']:>6} {load['median']:>10.1f} {load['p90']:>8.1f} {load['max']:>8.1f} "
          f"{report['engine_read_ms_mean']:>15.1f} {report['first_load_ms']:>9.1f}")
    print(f"{'ITL window':<14} {'p50 ms':>8} {'p99 ms':>8} {'samples':>8} {'seconds':>8}")
    for name, row in itl.items():
        print(f"{name:<14} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['samples']:>8} {row['window_s']:>8.2f}")
    print(f"p99 ITL rise during loads: {report['p99_rise_pct']:+.1f}% (issue 43: at most +10%; "
          f"load median under 100 ms)")


@contextlib.contextmanager
def spawned_engine(opts: argparse.Namespace, rank: int, logs: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`pageserve engine --enable-lora` on a free loopback port, for this run only."""
    from ops.launcher import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    args = ["engine", "--model", opts.model, "--dtype", opts.dtype, "--listen", address, "--enable-lora",
            "--max-lora-rank", str(max(64, rank)), "--max-cpu-loras", str(opts.loads + 2),
            "--max-model-len", str(opts.prompt + opts.output + 16), *opts.engine_arg]
    if opts.threads:
        args += ["--threads", str(opts.threads)]
    with open(logs, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ops.cli", *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield address, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def connect(address: str, proc: subprocess.Popen | None, timeout: float = 600.0) -> EngineClient:
    """A started EngineClient, retried while a spawned engine loads its model."""
    deadline = time.monotonic() + timeout
    while True:
        client = EngineClient(address, gateway_id="bench-lora-load", handshake_timeout=2.0)
        try:
            await client.start()
            return client
        except EngineUnavailableError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the engine exited with {proc.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise


async def run(address: str, proc: subprocess.Popen | None, warmup: Path, paths: list[Path],
              opts: argparse.Namespace) -> dict:
    client = await connect(address, proc)
    try:
        return await measure(client, warmup, paths, opts)
    finally:
        await client.close()


def profile_one(path: Path, spec: Any, opts: argparse.Namespace, rank: int) -> str:
    """cProfile of the engine's reader (load_adapter) on one more cold file, in this process, nothing else
    running: where a load's time goes (the safetensors copy out of the file, the casts, the stacking)."""
    import cProfile
    import io
    import pstats

    import torch

    from engine.worker.lora.adapter import load_adapter

    if opts.threads:
        torch.set_num_threads(opts.threads)
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.runcall(load_adapter, path, "profiled", spec, max_rank=max(64, rank), dtype=getattr(torch, opts.dtype),
                    device="cpu", load_id=1)
    took = time.perf_counter() - began
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(10)
    body = out.getvalue()
    return f"one load in this process, alone, profiled: {took * 1000:.1f} ms\n" + body[body.find("   ncalls"):]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ops.bench.lora_load", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="a model name or folder (the engine's --model)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--size-mb", type=float, default=50.0, help="adapter_model.safetensors size to aim at (1e6 B)")
    p.add_argument("--rank", type=int, default=0, help="force this rank instead of the one --size-mb picks")
    p.add_argument("--loads", type=int, default=8, help="distinct adapters loaded one after another")
    p.add_argument("--streams", type=int, default=8, help="base-model streams decoding throughout")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--output", type=int, default=2048, help="tokens per stream (must outlast both windows)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens every stream has before the windows")
    p.add_argument("--baseline-s", type=float, default=3.0, help="the window with no loads")
    p.add_argument("--page-cache", choices=sorted(PAGE_CACHE), default="fadvise",
                   help="how the files leave the page cache before the loads (warm: they stay)")
    p.add_argument("--dir", default=None, help="where the adapters are written (default: the temp dir; not tmpfs)")
    p.add_argument("--threads", type=int, default=0, help="the engine's torch threads (0: its default)")
    p.add_argument("--engine", default=None, help="an engine already running with --enable-lora (not spawned)")
    p.add_argument("--engine-arg", action="append", default=[], help="one more word for `pageserve engine`")
    p.add_argument("--profile", action="store_true", help="then profile one more cold load in this process")
    p.add_argument("--json", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    from engine.worker.model_loader import read_architecture
    from shared.model_store import resolve_model

    spec, _ = read_architecture(resolve_model(opts.model).config)
    rank = opts.rank or pick_rank(spec, opts.size_mb)
    with tempfile.TemporaryDirectory(prefix="lora-load-", dir=opts.dir) as tmp:
        raw, warmup, *paths = write_adapters(Path(tmp), spec, rank, opts.loads + 2 + opts.profile)
        size = (paths[0] / "adapter_model.safetensors").stat().st_size
        print(f"wrote {len(paths) + 2} adapters of {size / 1e6:.1f} MB (rank {rank}) in {tmp}", flush=True)
        page_cache = evict([raw, warmup, *paths], opts.page_cache)
        disk_s = disk_read_s(raw)
        profiled = paths.pop() if opts.profile else None
        logs = Path(tmp) / "engine.log"
        with contextlib.ExitStack() as stack:
            address, proc = (opts.engine, None) if opts.engine else stack.enter_context(spawned_engine(opts, rank, logs))
            try:
                report = asyncio.run(run(address, proc, warmup, paths, opts))
            except Exception:
                if logs.exists():
                    sys.stderr.write(logs.read_text(errors="replace")[-4000:])
                raise
        profile = profile_one(profiled, spec, opts, rank) if profiled is not None else ""
    report = {"model": opts.model, "dtype": opts.dtype, "streams": opts.streams, "rank": rank,
              "file_mb": size / 1e6, "page_cache": page_cache, "disk_read_ms": disk_s * 1000, **report}
    print_report(report)
    print(profile, end="")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"args": vars(opts), **report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
