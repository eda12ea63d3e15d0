"""ops/grafana-dashboard.json queries only metrics /metrics exports (the e2e scrape checks it again)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import EngineCollector, GatewayMetrics, RequestObservation, render
from shared.protocol import PriorityLoad, Stats, TenantLoad

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana-dashboard.json"
_NAME = re.compile(r"\b((?:vllm|pageserve):[A-Za-z0-9_:]+)")


def dashboard_metric_names() -> set[str]:
    """Every series name a panel or variable queries."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return {m for e in exprs for m in _NAME.findall(e)}


def exported_sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_queried_metric_is_exported() -> None:
    metrics = GatewayMetrics()
    metrics.observe(RequestObservation(
        route="/v1/chat/completions", status=200, tenant="acme", model_name="m", e2e_s=0.5, ttft_s=0.1,
        token_intervals_s=[0.01], prompt_tokens=5, completion_tokens=2, cached_tokens=0, finish_reasons=["stop"],
        admission_s=0.001, refusal="rpm", generated=True, queue_s=0.2))
    metrics.active_streams.inc()
    stats = Stats(1, 0, 0, 10, 20, 0, 5, 1, 0, 1, 1.0, 1, num_total_cpu_blocks=4, num_free_cpu_blocks=4,
                  by_priority=[PriorityLoad(0, 1, 0)], by_tenant=[TenantLoad("t_1", 1, 5)])
    text = render(metrics, EngineCollector(lambda: (stats, "m", True))).decode()
    names = dashboard_metric_names()
    assert len(names) >= 20
    missing = names - exported_sample_names(text)
    assert not missing, missing


def test_the_dashboard_is_valid_grafana_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "pageserve"
    assert all(p["targets"] and p["datasource"]["type"] == "prometheus" for p in dash["panels"])
