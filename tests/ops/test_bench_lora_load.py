"""`bench lora-load`'s smoke: two tiny cold loads through a real engine loop (in a thread here, so the test
pays no second torch start-up) while two streams decode; the report's shape, not its timings."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import CacheConfig, EngineConfig, LoraConfig, ModelConfig
from engine.core import EngineCore
from engine.serving.server import EngineServer, ServerConfig
from ops.bench.lora_load import itls_in, main, percentile
from ops.launcher import free_port
from tests.engine.model_fixtures import tiny_model

__all__ = ["tiny_model"]


@pytest.fixture
def lora_engine(tiny_model: Path) -> Iterator[str]:
    core = EngineCore(EngineConfig(
        model=ModelConfig(str(tiny_model), dtype="float32", max_model_len=1024),
        cache=CacheConfig(block_size=16, num_device_blocks=160, num_cpu_blocks=0),
        lora=LoraConfig(enabled=True, max_lora_rank=8, max_cpu_loras=8),
    ))
    server = EngineServer(core, core.model_info, ServerConfig(listen=f"tcp://127.0.0.1:{free_port()}",
                                                              shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server.address
    server.request_stop()
    thread.join(10)


def test_two_cold_loads_give_the_full_report(lora_engine: str, tiny_model: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "load.json"
    assert main(["--engine", lora_engine, "--model", str(tiny_model), "--dtype", "float32", "--rank", "4",
                 "--loads", "2", "--streams", "2", "--output", "900", "--baseline-s", "0.2",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["rank"] == 4 and report["loads"] == 2 and report["file_mb"] > 0 and report["disk_read_ms"] > 0
    assert report["page_cache"].startswith(("cold", "warm"))
    assert len(report["load_ms"]["all"]) == 2 and all(ms > 0 for ms in report["load_ms"]["all"])
    assert 0 < report["load_ms"]["median"] <= report["load_ms"]["p90"] <= report["load_ms"]["max"]
    for window in ("baseline", "during_loads"):
        itl = report["itl"][window]
        assert itl["samples"] > 0 and 0 < itl["p50_ms"] <= itl["p99_ms"]
    assert isinstance(report["p99_rise_pct"], float)
    printed = capsys.readouterr().out
    assert "rank 4" in printed and "p99 ITL rise during loads" in printed


def test_window_gaps_and_percentiles() -> None:
    stamps = [[0.0, 1.0, 3.0, 6.0], [0.5, 2.5]]
    assert sorted(itls_in(stamps, 1.0, 4.0)) == [1.0, 2.0, 2.0]  # a gap belongs to the window its end is in
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == 2.0
    assert percentile([], 99) == 0.0
