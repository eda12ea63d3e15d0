"""ops/bench/kernels/attention.py runs end to end on the CPU (interpreter) and writes its table and JSON."""

from __future__ import annotations

import json

import pytest

from ops.bench.kernels import attention as bench


def test_dry_run_checks_correctness_then_prints_one_table(tmp_path, capsys) -> None:
    path = tmp_path / "bench.json"
    assert bench.main(["--dry-run", "--grid", "2x40", "--dtype", "float32", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("correctness: ok") < printed.index("measured copy bandwidth")
    assert printed.rstrip().splitlines()[-1].split()[:2] == ["2", "40"]  # the table comes last
    result = json.loads(path.read_text())
    (row,) = result["rows"]
    assert (row["batch"], row["context"]) == (2, 40)
    assert row["triton_us"] > 0 and row["sdpa_us"] > 0
    assert row["max_err"] < 1e-4  # the Triton output agrees with SDPA on the gathered data


def test_grid_parsing() -> None:
    args = bench.parse_args(["--grid", "1x32768,64x2048"])
    assert bench.grid_of(args) == ((1, 32768), (64, 2048))
    assert bench.grid_of(bench.parse_args([])) == bench.GPU_GRID
    assert (args.n_q, args.n_kv, args.head_dim) == (32, 8, 128)


@pytest.mark.kernel_full
def test_dry_run_sweep(capsys) -> None:
    assert bench.main(["--dry-run", "--sweep", "--grid", "1x20"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("  best ") == 2
