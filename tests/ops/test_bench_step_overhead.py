"""`pageserve bench step-overhead`: its clock, its patching, and a run on a tiny random Llama."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ops.bench import step_overhead
from ops.bench.step_overhead import Clock, patched
from tests.engine.model_fixtures import tiny_model

__all__ = ["tiny_model"]


def test_a_kernel_inside_a_kernel_counts_once_and_stages_exclude_nested_ones() -> None:
    clock = Clock()
    inner = clock.kernel("inner", lambda: time.sleep(0.02))
    outer = clock.kernel("outer", lambda: (time.sleep(0.01), inner()))
    nested = clock.staged("nested", outer)
    stage = clock.staged("stage", lambda: (time.sleep(0.03), nested()))
    stage()
    assert "inner" not in clock.kernel_s and clock.calls["outer"] == 1
    assert clock.kernel_s["outer"] >= 0.03
    assert clock.kernel_in_stage_s["nested"] == clock.kernel_s["outer"] and "stage" not in clock.kernel_in_stage_s
    assert 0.03 <= clock.stage_s["stage"] < clock.stage_s["stage"] + clock.stage_s["nested"]  # its own 30 ms only
    assert clock.stage_s["nested"] >= 0.03


def test_patched_puts_everything_back_even_on_error() -> None:
    class Owner:
        f = staticmethod(lambda: "f")

    table = {"g": lambda: "g"}
    with pytest.raises(RuntimeError), patched([(Owner, "f", lambda fn: lambda: "F"), (table, "g", lambda fn: lambda: "G")]):
        assert Owner.f() == "F" and table["g"]() == "G"
        raise RuntimeError
    assert Owner.f() == "f" and table["g"]() == "g"


def test_the_bench_prints_kernels_and_glue_per_stage(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert step_overhead.main(["--model", str(tiny_model), "--dtype", "float32", "--running", "4", "--context", "8",
                               "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode step, 4 running" in out
    kernels = out.split("kernels ")[1].split(" ms:")[0]
    glue = out.split("glue ")[1]
    assert float(kernels) > 0 and ("linear" in out or "GEMM" in out)  # the products are kernels, whichever path
    for stage in (*step_overhead.STAGES, "other"):
        assert f"{stage} " in glue
