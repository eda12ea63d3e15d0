"""Operator endpoints and per-request context around a fake engine: /ready, /version, /metrics,
x-request-id, the access log line, and refusals while draining."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.logging_setup import configure_logging

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def scrape(gw: Any) -> dict[str, Any]:
    r = gw.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def sample(families: dict[str, Any], family: str, sample_name: str, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return 0.0


def test_every_response_has_a_request_id_and_a_client_id_is_ignored_by_default(make_gateway: Any) -> None:
    gw = make_gateway()
    seen = set()
    for r in (gw.client.get("/health"), gw.client.get("/nope"), gw.post("/v1/chat/completions", CHAT, key="bad"),
              gw.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2},
                             headers={"Authorization": f"Bearer {gw.key}", "x-request-id": "from-client"})):
        rid = r.headers["x-request-id"]
        assert len(rid) == 32 and rid != "from-client"
        seen.add(rid)
    assert len(seen) == 4
    # The engine request (and completion id) embeds the x-request-id: the engine's log line carries it.
    assert gw.engine.submitted[-1].request_id == "chatcmpl-" + r.headers["x-request-id"]
    assert r.json()["id"] == gw.engine.submitted[-1].request_id


def test_ready_version_and_metrics_move_with_requests(make_gateway: Any) -> None:
    gw = make_gateway()
    r = gw.client.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready", "problems": []}
    v = gw.client.get("/version").json()
    assert v["protocol_version"] == 1 and v["model"] == "smollm2" and v["version"]
    before = scrape(gw)
    assert sample(before, "pageserve:requests", "pageserve:requests_total", tenant="acme") == 0
    r = gw.post("/v1/chat/completions", {**CHAT, "max_tokens": 4, "stream": True})
    assert r.status_code == 200
    gw.post("/v1/chat/completions", CHAT, key="bad")
    after = scrape(gw)
    assert sample(after, "pageserve:requests", "pageserve:requests_total", tenant="acme",
                  route="/v1/chat/completions", status="200") == 1
    assert sample(after, "pageserve:requests", "pageserve:requests_total", tenant="-", status="401") == 1
    assert sample(after, "pageserve:generation_tokens", "pageserve:generation_tokens_total", tenant="acme") == 4
    assert sample(after, "pageserve:prompt_tokens", "pageserve:prompt_tokens_total", tenant="acme") == len(
        gw.engine.submitted[0].prompt_token_ids)
    labels = {"model_name": "smollm2", "engine": "0"}
    assert after["vllm:time_to_first_token_seconds"].type == "histogram"
    assert sample(after, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count",
                  **labels) == 1
    assert sample(after, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count",
                  **labels) == 3
    assert sample(after, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count",
                  **labels) == 1
    assert sample(after, "vllm:request_success", "vllm:request_success_total", finished_reason="length") == 1
    assert sample(after, "pageserve:active_streams", "pageserve:active_streams") == 0
    assert sample(after, "pageserve:engine_up", "pageserve:engine_up") == 1
    # One engine, no replica router: its counters stay 0 and there are no per-replica gauges.
    assert after["pageserve:router_retries"].type == "counter"
    assert sample(after, "pageserve:router_retries", "pageserve:router_retries_total") == 0
    assert "pageserve:live_replicas" not in after and "pageserve:replica_requests_waiting" not in after


def test_the_engines_queue_time_is_vllms_histogram_observed_once_per_request(make_gateway: Any) -> None:
    from tests.gateway.fakes import Script

    gw = make_gateway(lambda req: Script([[5, 6]] * req.sampling.n, queue_seconds=0.75))
    assert gw.post("/v1/chat/completions", {**CHAT, "max_tokens": 2, "n": 3}).status_code == 200
    after = scrape(gw)
    labels = {"model_name": "smollm2", "engine": "0"}
    queue = "vllm:request_queue_time_seconds"
    assert after[queue].type == "histogram"
    assert sample(after, queue, queue + "_count", **labels) == 1  # three samples, one request
    assert sample(after, queue, queue + "_sum", **labels) == 0.75
    assert sample(after, queue, queue + "_bucket", le="0.5", **labels) == 0  # vLLM's request latency buckets
    assert sample(after, queue, queue + "_bucket", le="0.8", **labels) == 1


def test_ready_names_what_is_wrong(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.dead = True
    r = gw.client.get("/ready")
    assert r.status_code == 503
    assert r.json()["problems"] == ["engine: not connected"]
    assert gw.client.get("/health").status_code == 503  # /health stays what it was (engine and Redis)


def test_draining_refuses_new_requests_with_retry_after_but_answers_probes(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.client.app.state.lifecycle.draining = True
    r = gw.post("/v1/chat/completions", CHAT)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and r.headers["x-request-id"]
    assert r.json()["error"]["code"] == "shutting_down"
    assert gw.engine.submitted == []
    ready = gw.client.get("/ready")
    assert ready.status_code == 503 and ready.json()["problems"] == ["draining: the gateway is shutting down"]
    assert gw.client.get("/metrics").status_code == 200


def test_json_access_log_line_has_the_request_and_no_secret(make_gateway: Any, capsys: Any) -> None:
    gw = make_gateway()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    configure_logging("info", "json")
    try:
        r = gw.post("/v1/chat/completions", {**CHAT, "max_tokens": 3})
        gw.post("/v1/chat/completions", CHAT, key="ps-not-a-real-key")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    access = [x for x in lines if x["logger"] == "pageserve.access"]
    ok = next(x for x in access if x["request_id"] == r.headers["x-request-id"])
    assert ok["status"] == 200 and ok["tenant"] == "acme" and ok["route"] == "/v1/chat/completions"
    assert ok["completion_tokens"] == 4 and ok["prompt_tokens"] > 0 and ok["outcome"] == "length"
    assert ok["duration_s"] >= 0 and ok["ttft_s"] is not None and ok["level"] == "INFO"
    assert any(x["status"] == 401 for x in access)
    text = json.dumps(lines)
    assert "capital of France" not in text and gw.key not in text and "ps-not-a-real-key" not in text


@pytest.mark.parametrize("trusted", [True, False])
def test_a_request_id_from_a_trusted_proxy_is_kept_if_it_is_a_plain_token(make_gateway: Any, trusted: bool) -> None:
    gw = make_gateway(trusted_request_id=trusted)
    r = gw.client.get("/health", headers={"x-request-id": "lb-1234"})
    assert (r.headers["x-request-id"] == "lb-1234") is trusted
    assert gw.client.get("/health", headers={"x-request-id": "bad id\\n"}).headers["x-request-id"] != "bad id\\n"
    if trusted:  # a proxy may repeat ids: the engine's id stays unique and still carries it
        body = {**CHAT, "max_tokens": 2}
        for _ in range(2):
            gw.client.post("/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {gw.key}", "x-request-id": "lb-1234"})
        ids = [a.request_id for a in gw.engine.submitted]
        assert len(set(ids)) == 2 and all(i.startswith("chatcmpl-lb-1234.") for i in ids)


def test_cors_origins_setting(make_gateway: Any) -> None:
    gw = make_gateway(cors_origins=("https://app.example",))
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization,content-type"}
    r = gw.client.options("/v1/chat/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = gw.client.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
    assert r.status_code == 400
    assert "access-control-allow-origin" not in make_gateway().client.get(
        "/health", headers={"origin": "https://app.example"}).headers


def test_engine_figures_under_vllm_names_and_our_extras() -> None:
    from gateway.metrics import EngineCollector, GatewayMetrics, render
    from shared.protocol import PriorityLoad, Stats, TenantLoad

    stats = Stats(3, 2, 1, 25, 100, 7, 40, 5, 1, 4, 2.0, 2, num_prompt_tokens=300, num_generation_tokens=120,
                  prefix_cache_queries=300, prefix_cache_hits=96, num_swaps_out=5, num_recomputes=2,
                  num_free_cpu_blocks=30, num_total_cpu_blocks=40, by_priority=[PriorityLoad(0, 1, 2),
                                                                                 PriorityLoad(2, 3, 1)],
                  by_tenant=[TenantLoad("t_a", 2, 100), TenantLoad("t_b", 4, 20)])
    text = render(GatewayMetrics(), EngineCollector(lambda: (stats, "smollm2", True))).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    m = {"model_name": "smollm2", "engine": "0"}
    assert families["vllm:num_requests_running"].type == "gauge"
    assert sample(families, "vllm:num_requests_waiting", "vllm:num_requests_waiting", **m) == 2
    assert sample(families, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc", **m) == 0.75
    assert families["vllm:num_preemptions"].type == "counter"
    assert sample(families, "vllm:num_preemptions", "vllm:num_preemptions_total", **m) == 7
    assert sample(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total", **m) == 96
    assert sample(families, "vllm:generation_tokens", "vllm:generation_tokens_total", **m) == 120
    assert sample(families, "pageserve:preemption_swaps", "pageserve:preemption_swaps_total", **m) == 5
    assert sample(families, "pageserve:requests_queued", "pageserve:requests_queued", priority="2") == 3
    assert sample(families, "pageserve:tenant_engine_generated_tokens",
                  "pageserve:tenant_engine_generated_tokens_total", tenant_id="t_a") == 100


def test_route_labels_are_templates_never_raw_paths(make_gateway: Any) -> None:
    gw = make_gateway()
    for i in range(3):
        gw.client.get(f"/v1/no-such-thing-{i}")
    families = scrape(gw)
    routes = {s.labels["route"] for s in families["pageserve:requests"].samples if "route" in s.labels}
    assert not any("no-such-thing" in r for r in routes) and "other" in routes
