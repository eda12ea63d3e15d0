"""ops/gpu_check runs end to end without a GPU: Triton interpreted, a tiny random model, tiny sweeps.

This proves the script itself (every section, the summary, the exit status)
before a GPU is lent; on a GPU machine `python -m ops.gpu_check` runs the real sizes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

SECTIONS = ("versions", "gpu tests", "engine parity", "default sampling", "decode sweep", "decode step profile",
            "decode attention vs bandwidth", "prefill warps")


@pytest.mark.slow
def test_interpreted_tiny_run_passes_every_section() -> None:
    result = subprocess.run([sys.executable, "-m", "ops.gpu_check", "--interpret", "--tiny"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in SECTIONS:
        assert f"PASS {name}" in result.stdout
    assert "float32 on cpu vs CPU float32 greedy: identical" in result.stdout
    assert "paged-attention variants (bfloat16)" in result.stdout
    assert f"== {len(SECTIONS)}/{len(SECTIONS)} passed" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the check runs for real")
def test_refuses_to_run_compiled_without_cuda() -> None:
    result = subprocess.run([sys.executable, "-m", "ops.gpu_check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--interpret --tiny" in result.stderr
