"""Every kernel compiles for an H100/H200 (sm_90) on this CPU machine, with pipelined K/V loads.

The interpreter never runs Triton's GPU compiler; ops/kernels_aot.py does, in a
subprocess without TRITON_INTERPRET (this session's kernels are interpreted).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_aot(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "ops.kernels_aot", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_representative_kernels_compile_for_sm90() -> None:
    result = run_aot("--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(lines) == 7 and all(line.startswith("ok") for line in lines)
    assert sum(" lora_" in line for line in lines) == 2  # the LoRA shrink and expand of a decode step
    shrink = next(line for line in lines if "lora_shrink" in line)
    assert " 0 16B async copies" not in shrink  # A and x stream through pipelined 16-byte copies
    decode = next(line for line in lines if "decode" in line)
    assert " 0 16B async copies" not in decode


def test_refuses_to_run_under_the_interpreter() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ops.kernels_aot", "--quick"],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=60,
    )
    assert result.returncode == 2 and "TRITON_INTERPRET" in result.stderr


@pytest.mark.kernel_full
def test_all_variants_compile_for_sm90() -> None:
    result = run_aot()
    assert result.returncode == 0, result.stdout
