"""ops/bench/kernels/cpu_prefill.py runs end to end on a small step and prints both implementations and the pick."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.bench.kernels import cpu_prefill as bench
from pageserve_kernels import choice, cpu_prefill


def test_causal_flops_count_each_visible_pair_once() -> None:
    # 3 new tokens after 2 cached: they see 3, 4 and 5 keys; 4 x head size FLOP per pair and query head
    assert bench.causal_flops([(3, 2)], heads=2, head_dim=8) == (3 + 4 + 5) * 2 * 4 * 8
    assert bench.causal_flops([(1, 0), (2, 0)], heads=1, head_dim=1) == (1 + 1 + 2) * 4


def test_prints_both_implementations_and_the_pick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    if cpu_prefill.load() is None:
        pytest.skip("no AVX2+FMA or no C compiler: the native prefill kernel cannot be built")
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    args = ["--chunks", "40x0", "7x33", "--dtype", "float32", "--rounds", "1", "--threads", "1"]
    assert bench.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "chunks 40x0 7x33" in lines[0]
    assert [line.split()[0] for line in lines[1:-1]] == ["c", "torch"]
    assert lines[-1].split()[-1] in ("c", "torch")
