"""/metrics before the engine's first Stats: every series the Grafana dashboard queries is there (0), with
`pageserve:engine_stats_reported` 0; once Stats arrive the gauge is 1 and the series carry the engine's values."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import Prompts
from gateway.state import GatewayState
from shared.protocol import Stats
from tests.gateway.fakes import FakeEngine, FakeEngineSource, Script

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana-dashboard.json"


def dashboard_vllm_series() -> set[str]:
    """The sample names (`vllm:..._bucket`, `..._total`, gauges) the dashboard's queries read."""
    exprs = [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel.get("targets", [])]
    return set(re.findall(r"vllm:[a-z0-9_]+", " ".join(exprs)))


class NoRedis:
    async def ping(self) -> bool:
        return True


def scrape(client: TestClient) -> dict[str, float]:
    """Every sample on /metrics as 'name{model_name}' -> value (vLLM's series carry the model label)."""
    r = client.get("/metrics")
    assert r.status_code == 200
    return {f"{s.name}{{{s.labels.get('model_name', '')}}}": s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_every_dashboard_series_is_there_before_the_engine_reports(tokenizer: Any) -> None:
    source = FakeEngineSource(FakeEngine(lambda request: Script(samples=[[1]])))

    @contextlib.asynccontextmanager
    async def services(config: GatewayConfig) -> AsyncIterator[GatewayState]:
        yield GatewayState(config, source, Prompts(tokenizer), NoRedis(), NoRedis())  # type: ignore[arg-type]

    wanted = dashboard_vllm_series()
    assert len(wanted) >= 14, wanted  # the dashboard was read: gauges, counters and histograms
    with TestClient(create_app(GatewayConfig(model="smollm2"), services)) as client:
        first = scrape(client)
        model = source.engine.model_info.model_name
        missing = {name for name in wanted if f"{name}{{{model}}}" not in first}
        assert not missing, f"absent before the engine reported: {sorted(missing)}"
        assert first["pageserve:engine_stats_reported{}"] == 0
        assert first[f"vllm:num_requests_running{{{model}}}"] == 0
        assert first[f"vllm:request_success_total{{{model}}}"] == 0

        source.latest_stats = Stats(3, 2, 0, 25, 100, 7, 40, 5, 1, 4, 2.0, 1)  # type: ignore[misc]
        later = scrape(client)
        assert later["pageserve:engine_stats_reported{}"] == 1
        assert later[f"vllm:num_requests_running{{{model}}}"] == 3
        assert later[f"vllm:kv_cache_usage_perc{{{model}}}"] == 0.75
        assert all(f"{name}{{{model}}}" in later for name in wanted)
