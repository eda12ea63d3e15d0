"""vLLM as a same-run peer, driven from its own virtualenv through `--vllm-python PATH`.

    run_offline(python, model_dir, dtype, workload, prefix_caching) -> PeerResult
        LLM.generate in a subprocess (ops/bench/vllm_worker.py), same token-id prompts,
        greedy, EOS ignored; a failure comes back as PeerResult.error, never an exception
    run_worker(..., return_tokens=True) -> dict | str
        the same run's raw result (with every request's token ids), or why there is none
    VllmServer(python, model_dir, dtype, port, prefix_caching)   (context manager)
        `vllm serve` on 127.0.0.1 with its log in a temporary file; .base_url once healthy

The environment is PERFORMANCE.md's: both cores for vLLM's OpenMP threads
(VLLM_CPU_OMP_THREADS_BIND=0-1; its default reserves one of two) and 4 GiB of KV
(VLLM_CPU_KVCACHE_SPACE=4), and VLLM_TARGET_DEVICE=cpu (its platform probe looks for
"cpu" in the version of a distribution named `vllm`, which `vllm-cpu` is not); the caller's own values win. PYTHONPATH is dropped so
our tree never shadows vLLM's modules. The model is the Hugging Face folder the
model store converted from the GGUF (what the engine itself loads). This module
owns starting and reading the peer; it knows nothing of tables or workloads' meaning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from ops.bench.workloads import Workload

WORKER = Path(__file__).with_name("vllm_worker.py")
OFFLINE_TIMEOUT_S = 1800.0
SERVE_START_TIMEOUT_S = 600.0
"""vLLM's start on 2 cores (model load, torch.compile, warm-up) takes a minute or more."""


@dataclass(frozen=True)
class PeerResult:
    name: str
    seconds: float | None = None
    output_tokens: int = 0
    error: str | None = None
    """Why the peer has no figures (not given, not installed, crashed); None when it ran."""
    version: str = ""
    prefix_caching: bool = False
    """Rows are compared with the reference row of the same setting."""

    @property
    def tok_s(self) -> float | None:
        return self.output_tokens / self.seconds if self.seconds else None


def peer_env(threads: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if threads:  # the same thread count as ours in a same-run comparison
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")  # its platform probe reads the `vllm` distribution's version
    return env


def missing_reason(python: str | None) -> str | None:
    """Why vLLM cannot be run from this interpreter path, or None when it looks runnable."""
    if not python:
        return "not run: pass --vllm-python PATH (vLLM's CPU build in its own virtualenv)"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return f"not run: {python} is not an executable file"
    return None


def run_offline(python: str | None, model_dir: str, dtype: str, workload: Workload, prefix_caching: bool,
                max_model_len: int = 2048, threads: int | None = None) -> PeerResult:
    name = f"vLLM offline{' +prefix cache' if prefix_caching else ''}"
    out = run_worker(python, model_dir, dtype, workload, prefix_caching, max_model_len, threads)
    if isinstance(out, str):
        return PeerResult(name, error=out, prefix_caching=prefix_caching)
    return PeerResult(name, out["seconds"], out["output_tokens"], version=out.get("vllm_version", ""),
                      prefix_caching=prefix_caching)


def run_worker(python: str | None, model_dir: str, dtype: str, workload: Workload, prefix_caching: bool = False,
               max_model_len: int = 2048, threads: int | None = None,
               return_tokens: bool = False) -> dict[str, Any] | str:
    """vllm_worker.py's RESULT (token counts checked against the workload), or why there is none."""
    reason = missing_reason(python)
    if reason or python is None:
        return reason or "not run"
    spec = {"model": model_dir, "dtype": dtype, "prefix_caching": prefix_caching, "max_model_len": max_model_len,
            "prompts": workload.prompts, "output_lens": workload.output_lens, "return_tokens": return_tokens}
    with tempfile.TemporaryDirectory(prefix="pageserve-vllm-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        try:
            done = subprocess.run([python, str(WORKER), "offline", str(spec_path)], env=peer_env(threads), cwd=tmp,
                                  capture_output=True, text=True, timeout=OFFLINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"failed: no result within {OFFLINE_TIMEOUT_S:g} s"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"failed (exit {done.returncode}): {' | '.join(tail)[-400:]}"
    out: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    if out["output_tokens"] != workload.output_tokens:
        return f"produced {out['output_tokens']} tokens, wanted {workload.output_tokens}"
    return out


class VllmServer:
    """`vllm serve` on loopback for the HTTP comparison; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, python: str, model_dir: str, dtype: str, port: int, prefix_caching: bool = True,
                 served_name: str = "smollm2", threads: int | None = None) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        fd, self.log_path = tempfile.mkstemp(prefix="pageserve-vllm-serve-", suffix=".log")
        args = [python, str(WORKER), "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
                "--served-model-name", served_name, "--max-model-len", "2048", "--seed", "0",
                "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
        self.proc = subprocess.Popen(args, env=peer_env(threads), stdout=fd, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        os.close(fd)  # the child keeps its own copy

    def wait_ready(self, timeout_s: float = SERVE_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not healthy within {timeout_s:g} s: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        return " | ".join(Path(self.log_path).read_text(errors="replace").strip().splitlines()[-lines:])[-600:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the API server and its engine core
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        os.unlink(self.log_path)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
