"""ops/bench/kernels/lora.py runs end to end on the CPU (interpreter), checks correctness first, and
writes its table and JSON."""

from __future__ import annotations

import json

import pytest

from ops.bench.kernels import lora as bench


def test_dry_run_prints_one_table_and_json(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main() sets it too: restored after the test
    path = tmp_path / "lora.json"
    assert bench.main(["--dry-run", "--projections", "qkv", "down", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("correctness: ok") < printed.index("LoRA shrink + expand")
    assert [line.split()[0] for line in printed.rstrip().splitlines()[-2:]] == ["qkv", "down"]
    rows = json.loads(path.read_text())["rows"]
    assert [(r["projection"], r["rows"], r["adapters"], r["rank"]) for r in rows] == [
        ("qkv", 9, 2, 8), ("down", 9, 2, 8)]
    assert all(r["triton_us"] > 0 and r["torch_us"] > 0 and r["max_err"] < 6e-2 for r in rows)


def test_a_wrong_kernel_result_fails_the_run(capsys, monkeypatch) -> None:
    from engine.worker.lora.device_weights import GpuLoraStep

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(GpuLoraStep, "add", lambda *args: None)  # the LoRA term never added
    assert bench.main(["--dry-run", "--projections", "o"]) == 1
    assert "correctness check failed" in capsys.readouterr().err


def test_bytes_and_flops_of_a_step() -> None:
    # 3 adapter rows of 2 adapters (one base row), rank 4, K = 10, two slices of 6 and 2 output columns
    moved, flops = bench.moved_bytes_and_flops([1, 0, 2, 1], 4, 10, [(0, 6), (6, 8)], 2)
    weights = 2 * (4 * 10 + 6 * 4 + 4 * 10 + 2 * 4)
    assert moved == (3 * 10 + 2 * 3 * 8 + weights) * 2
    assert flops == 2 * 3 * 2 * 4 * 10 + 2 * 3 * 8 * 4


@pytest.mark.parametrize("ids, adapters", [([1, 2, 3, 0], 3)])
def test_step_rows_interleave_adapters_with_base_rows(ids, adapters) -> None:
    assert bench.step_rows(4, adapters) == ids
