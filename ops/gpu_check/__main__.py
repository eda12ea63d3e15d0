"""python -m ops.gpu_check: one run that says whether the GPU path is ready (under 8 minutes on a GPU).

    python -m ops.gpu_check                     on a CUDA machine: everything below
    python -m ops.gpu_check --interpret --tiny  no GPU: the same script end to end, Triton interpreted
                                                on the CPU, a tiny model and tiny sizes

Sections, each printed with its time and PASS/FAIL (the exit status is 1 if any failed):
versions; the `gpu` tests (pytest -m gpu, compiled); the engine on the device in
float32 and bfloat16 against the CPU path's greedy tokens (and CUDA graphs
against eager); a default-sampling request; a decode sweep to 2,048 tokens
logging steps over 50 ms and compilations after start-up; decode attention
against the measured copy bandwidth (1 x 32k, 64 x 2k, 256 x 512); 4 vs 8 warps
for a 2,048-token prefill; one decode step profiled (wall vs kernel time).
Installs nothing; works with any torch >= 2.4 and Triton >= 3.2 that import.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ops.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--interpret", action="store_true", help="run the Triton kernels interpreted on the CPU")
    p.add_argument("--tiny", action="store_true", help="a tiny random model and tiny sweeps")
    p.add_argument("--model", default=None, help="a model spec (default: smollm2 if present, else random weights)")
    p.add_argument("--skip-tests", action="store_true", help="do not run the gpu-marked pytest tests")
    return p.parse_args(argv)


def versions() -> bool:
    import torch

    print(f"  python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}")
    try:
        import triton

        print(f"  triton {triton.__version__}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}")
    except ImportError:
        print("  triton: not installed")
        return False
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(f"  device {props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.0f} GiB")
    return True


def gpu_tests(interpret: bool) -> bool:
    if interpret:
        print("  skipped: the gpu tests need a CUDA device and compiled kernels")
        return True
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    cmd = [sys.executable, "-m", "pytest", "tests/kernels", "-m", "gpu", "-q", "-x", "-p", "no:cacheprovider"]
    root = Path(__file__).resolve().parents[2]  # the repository: tests/ lives there
    result = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    print("  " + "\n  ".join(result.stdout.strip().splitlines()[-3:]))
    return result.returncode == 0


def pick_model(args: argparse.Namespace, workdir: Path) -> str:
    from ops.gpu_check.random_model import SMOLLM2_SHAPE, TINY_SHAPE, write_random_llama

    if args.model:
        return str(args.model)
    if args.tiny:
        return str(write_random_llama(workdir / "tiny", TINY_SHAPE))
    try:
        from shared.model_store import resolve_model

        return str(resolve_model("smollm2").path)
    except Exception as exc:  # no converted model on this machine: same shape, random weights
        print(f"  smollm2 not available ({type(exc).__name__}); using random weights of its shape")
        return str(write_random_llama(workdir / "smollm2-shape", SMOLLM2_SHAPE))


def section(name: str, fn: Callable[[], bool], results: dict[str, bool]) -> None:
    print(f"== {name}", flush=True)
    start = time.perf_counter()
    try:
        ok = fn()
    except Exception:  # report and go on: one broken part must not hide the others
        traceback.print_exc(limit=6)
        ok = False
    results[name] = ok
    print(f"   {'PASS' if ok else 'FAIL'} {name} ({time.perf_counter() - start:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print("no CUDA device: run with --interpret --tiny to check the script itself", file=sys.stderr)
        return 2
    from ops.gpu_check import engine_checks, kernel_timing

    device = torch.device("cpu" if args.interpret else "cuda")
    results: dict[str, bool] = {}
    section("versions", versions, results)
    section("gpu tests", lambda: gpu_tests(args.interpret), results)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        setup = engine_checks.Setup(
            model=pick_model(args, Path(tmp)), device=str(device),
            max_num_batched_tokens=8 if args.tiny else 2048, max_num_seqs=4 if args.tiny else 64,
            parity_tokens=3 if args.tiny else 32, sweep_tokens=6 if args.tiny else 2048,
        )
        section("engine parity", lambda: engine_checks.check_parity(setup), results)
        section("default sampling", lambda: engine_checks.check_default_sampling(setup), results)
        section("decode sweep", lambda: engine_checks.check_decode_sweep(setup), results)
        section("decode step profile", lambda: engine_checks.profile_decode_step(setup), results)
    grids = [(1, 64), (2, 32)] if args.tiny else [(1, 32768), (64, 2048), (256, 512)]
    repeats = 1 if args.tiny else 20
    heads = kernel_timing.TINY_HEADS if args.tiny else kernel_timing.HEADS
    section("decode attention vs bandwidth", lambda: kernel_timing.check_decode_bandwidth(
        device, grids, 4 if args.tiny else 1024, repeats, heads), results)
    section("prefill warps", lambda: kernel_timing.compare_prefill_warps(
        device, 24 if args.tiny else 2048, repeats, heads), results)
    failed = [name for name, ok in results.items() if not ok]
    print(f"== {len(results) - len(failed)}/{len(results)} passed" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
