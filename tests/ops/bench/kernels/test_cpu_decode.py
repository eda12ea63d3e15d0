"""ops/bench/kernels/cpu_decode.py runs end to end on a small step and prints every variant and the pick."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ops.bench.kernels import cpu_decode as bench
from pageserve_kernels import choice, cpu_decode


def test_prints_each_variant_of_this_host_and_the_pick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    kernel = cpu_decode.load()
    if kernel is None:
        pytest.skip("no C compiler here: the native decode kernel cannot be built")
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    args = ["--requests", "4", "--context", "8", "40", "--layers", "2", "--rounds", "1", "--threads", "1"]
    assert bench.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = [line.split()[0] for line in lines[1:-1]]
    assert shown == list(kernel.applicable(torch.bfloat16, 64))
    assert lines[-1].split()[-1] in shown


def test_a_shared_prefix_gives_every_request_the_same_first_blocks() -> None:
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([40, 33, 64])
    tables, num_blocks = bench.block_tables(lens, 16, 2, gen)
    assert tables.shape == (3, 4) and num_blocks == 2 + 3 * 2
    assert (tables[:, :2] == torch.tensor([0, 1])).all()  # the shared blocks, in every table
    own = tables[:, 2:].flatten().tolist()
    assert sorted(own) == list(range(2, num_blocks))  # the rest each request's own, none reused
    with pytest.raises(SystemExit, match="needs every context above 32"):
        bench.main(["--requests", "2", "--context", "20", "40", "--shared-prefix", "32", "--layers", "1",
                    "--threads", str(torch.get_num_threads())])
