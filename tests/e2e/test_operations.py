"""Operations with real processes started from the systemd units' own commands (issue 12's must-show).

`pageserve admin install-units` writes the units into a temporary root; the
engine's and gateway's ExecStart lines (and the gateway's ExecStartPost /ready
probe) are run exactly as written, configured only through their PAGESERVE_*
environment twins (as the units' env files would), with two gateway workers.
The systemd-provided folders (CacheDirectory) are replaced by this session's
model cache so the model is not converted again. Tests run in file order and
end with the gateway's SIGTERM: the module owns its processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ops.units import UnitOptions, units
from tests.e2e.conftest import START_TIMEOUT_S
from tests.ops.test_grafana_dashboard import dashboard_metric_names
from tests.ops.test_units import parse_unit
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SYSTEMD_DIRS = ("PAGESERVE_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME")
PREFIX = "ops"
DRAIN_S = 5.0
"""Long enough for the short stream to finish on a busy 2-core host: SIGTERM comes only once it has its first
token, so it needs one more decode step (a step can take a second or two there), never a prefill."""
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}


def unit_command(name: str, key: str = "ExecStart") -> tuple[list[str], dict[str, str]]:
    """argv and Environment= of one unit, as install-units writes it."""
    service = parse_unit_text(units(UnitOptions())[name])["Service"]
    env: dict[str, str] = {}
    for line in service.get("Environment", "").splitlines():
        for item in shlex.split(line):
            k, _, v = item.partition("=")
            env[k] = v
    return shlex.split(service[key]), {k: v for k, v in env.items() if k not in SYSTEMD_DIRS}


def parse_unit_text(text: str) -> Any:
    with tempfile.NamedTemporaryFile("w", suffix=".service", delete=False) as f:
        f.write(text)
    try:
        return _multi_environment(parse_unit(Path(f.name)), text)
    finally:
        os.unlink(f.name)


def _multi_environment(parsed: Any, text: str) -> Any:
    """configparser keeps one Environment= line; systemd adds them all up."""
    lines = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("Environment=")]
    parsed["Service"]["Environment"] = "\n".join(lines)
    return parsed


@dataclass
class Ops:
    base: str
    key: str
    limited_key: str
    redis_url: str
    engine_env: dict[str, str]
    engine_argv: list[str]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]]

    def start_engine(self) -> None:
        out = open(self.logs / "engine.log", "ab")  # noqa: SIM115 - the child keeps the descriptor
        self.procs["engine"] = subprocess.Popen(self.engine_argv, env=self.engine_env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}


def _redis(url: str) -> Any:
    from gateway.tenancy import connect

    return connect(url)


async def _make_keys(redis_url: str) -> tuple[str, str]:
    from gateway.tenancy import TenantStore
    from gateway.tenancy.quota_store import QuotaStore

    redis = _redis(redis_url)
    try:
        store = TenantStore(redis, prefix=PREFIX, actor="e2e")
        await store.create_tenant("ops-tenant")
        await store.create_tenant("ops-limited")
        key, _ = await store.create_key("ops-tenant")
        limited, _ = await store.create_key("ops-limited")
        await QuotaStore(store).set("ops-limited", None, {"rpm": 1})
        return key, limited
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def ops(redis_url: str) -> Iterator[Ops]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-ops-"))
    engine_address = f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    engine_argv, unit_env = unit_command("pageserve-engine.service")
    engine_env = {**base_env, **unit_env, "PAGESERVE_ENGINE_LISTEN": engine_address,
                  "PAGESERVE_ENGINE_KV_CACHE_MEMORY": "0.5", "PAGESERVE_ENGINE_SHUTDOWN_GRACE": "1"}
    gateway_argv, unit_env = unit_command("pageserve-gateway.service")
    probe_argv, _ = unit_command("pageserve-gateway.service", "ExecStartPost")
    gateway_env = {**base_env, **unit_env, "PAGESERVE_ENGINE": engine_address, "PAGESERVE_REDIS_URL": redis_url,
                   "PAGESERVE_PORT": str(port), "PAGESERVE_REDIS_PREFIX": PREFIX, "PAGESERVE_GATEWAY_WORKERS": "2",
                   "PAGESERVE_DRAIN_TIME": str(DRAIN_S), "PAGESERVE_ENGINE_TIMEOUT": str(START_TIMEOUT_S),
                   "PAGESERVE_ENGINE_POLL_INTERVAL": "0.5", "PAGESERVE_ENGINE_RETRY_INTERVAL": "0.3",
                   "PAGESERVE_LOG_FORMAT": "json"}
    key, limited = asyncio.run(_make_keys(redis_url))
    o = Ops(f"http://127.0.0.1:{port}", key, limited, redis_url, engine_env, engine_argv, logs, {})
    o.start_engine()
    with open(logs / "gateway.log", "wb") as out:
        o.procs["gateway"] = subprocess.Popen(gateway_argv, env=gateway_env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
    ok = False
    try:
        probe = subprocess.run(probe_argv, env=gateway_env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        assert probe.returncode == 0, (probe.stderr, (logs / "gateway.log").read_text()[-3000:],
                                       (logs / "engine.log").read_text()[-3000:])
        yield o
        ok = True
    finally:
        for name in ("gateway", "engine"):
            p = o.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if ok:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"\noperations e2e logs kept in {logs}")


def scrape(base: str) -> dict[str, Any]:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    family = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    return sum(s.value for s in families[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())) if family in \
        families else 0.0


def stream_chat(base: str, key: str, body: dict[str, Any], events: list[Any], timeout: float = 120) -> None:
    with httpx.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}, timeout=timeout) as r:
        events.append(("status", r.status_code, time.monotonic()))
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                events.append(("data", payload if payload == "[DONE]" else json.loads(payload), time.monotonic()))


def _content_chunks(events: list[Any]) -> int:
    return sum(1 for kind, payload, _ in events if kind == "data" and isinstance(payload, dict)
               and payload.get("choices") and payload["choices"][0].get("delta", {}).get("content"))


def _first_error(events: list[Any]) -> tuple[dict[str, Any], float] | None:
    for kind, payload, at in events:
        if kind == "data" and isinstance(payload, dict) and "error" in payload:
            return payload["error"], at
    return None


def test_probes_version_and_metrics_that_move(ops: Ops) -> None:
    assert httpx.get(ops.base + "/health").status_code == 200
    ready = httpx.get(ops.base + "/ready")
    assert ready.status_code == 200 and ready.json()["problems"] == []
    version = httpx.get(ops.base + "/version").json()
    assert version["protocol_version"] == 1 and version["model"]
    model = version["model"]
    before = scrape(ops.base)
    responses: list[httpx.Response] = []

    def one() -> None:  # separate connections: the kernel spreads them over both workers
        responses.append(httpx.post(ops.base + "/v1/chat/completions", json={**CHAT, "max_tokens": 3},
                                    headers=ops.headers(), timeout=300))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(responses) == 4
    for r in responses:
        assert r.status_code == 200 and r.headers["x-request-id"], r.text
    usages = [r.json()["usage"] for r in responses]
    codes = [httpx.post(ops.base + "/v1/chat/completions", json={**CHAT, "max_tokens": 2},
                        headers=ops.headers(ops.limited_key), timeout=120).status_code for _ in range(2)]
    assert codes == [200, 429]
    completion = sum(u["completion_tokens"] for u in usages)
    deadline = time.monotonic() + 10
    while True:  # engine figures arrive with the next Stats poll (0.5 s)
        after = [scrape(ops.base) for _ in range(4)]  # several scrapes: either worker may answer
        if all(value(a, "vllm:generation_tokens_total") >= value(before, "vllm:generation_tokens_total") + completion
               for a in after) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for a in after:  # every worker's answer holds every worker's requests (multiprocess mode)
        d = {"tenant": "ops-tenant"}
        assert value(a, "pageserve:requests_total", route="/v1/chat/completions", status="200", **d) - value(
            before, "pageserve:requests_total", route="/v1/chat/completions", status="200", **d) == 4
        assert value(a, "pageserve:generation_tokens_total", **d) - value(
            before, "pageserve:generation_tokens_total", **d) == completion
        assert value(a, "vllm:time_to_first_token_seconds_count", model_name=model) - value(
            before, "vllm:time_to_first_token_seconds_count", model_name=model) == 5
        assert value(a, "vllm:request_queue_time_seconds_count", model_name=model) - value(
            before, "vllm:request_queue_time_seconds_count", model_name=model) == 5  # the engine's, per request
        assert value(a, "pageserve:rate_limit_refusals_total", kind="rpm") - value(
            before, "pageserve:rate_limit_refusals_total", kind="rpm") == 1
        assert value(a, "vllm:generation_tokens_total") >= value(before, "vllm:generation_tokens_total") + completion
    _check_vllm_conventions(after[0], model)


def _check_vllm_conventions(families: dict[str, Any], model: str) -> None:
    expected = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:num_requests_swapped": "gauge", "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter", "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:time_per_output_token_seconds": "histogram", "vllm:request_success": "counter",
        "vllm:request_queue_time_seconds": "histogram",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
        labels = {k for s in families[name].samples for k in s.labels} - {"le", "finished_reason"}
        assert labels == {"model_name", "engine"}, (name, labels)
        assert all(s.labels["model_name"] == model and s.labels["engine"] == "0" for s in families[name].samples)
    # A family counts as exported when declared, even with no sample now (no request queued at that priority).
    exported = {s.name for f in families.values() for s in f.samples} | set(families)
    assert dashboard_metric_names() <= exported, dashboard_metric_names() - exported


async def _conc_leases(redis_url: str) -> int:
    redis = _redis(redis_url)
    try:
        total = 0
        async for key in redis.scan_iter(match=f"{PREFIX}:conc:*"):
            total += await redis.zcard(key)
        return int(total)
    finally:
        await redis.aclose()


def test_engine_sigkill_fails_streams_fast_then_the_same_gateway_serves_again(ops: Ops) -> None:
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True}
    streams: list[list[Any]] = [[], []]
    threads = [threading.Thread(target=stream_chat, args=(ops.base, ops.key, body, s)) for s in streams]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(_content_chunks(s) >= 1 for s in streams):
        assert time.monotonic() < deadline, streams
        time.sleep(0.05)
    assert asyncio.run(_conc_leases(ops.redis_url)) == 2  # the check below is not vacuous
    ops.procs["engine"].kill()
    killed = time.monotonic()
    for t in threads:
        t.join(30)
    for s in streams:
        error = _first_error(s)
        assert error is not None, s[-3:]
        assert error[1] - killed < 2.0 and error[0]["code"] == "engine_unavailable"
    deadline = time.monotonic() + 10
    while asyncio.run(_conc_leases(ops.redis_url)) != 0:  # settled (the stream's close settles it)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ready = [httpx.get(ops.base + "/ready") for _ in range(4)]
    assert all(r.status_code == 503 and "engine" in r.json()["problems"][0] for r in ready)
    ops.procs["engine"].wait()
    ops.start_engine()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(httpx.get(ops.base + "/ready").status_code == 200 for _ in range(4)):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    r = httpx.post(ops.base + "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=ops.headers(),
                   timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


async def _usage(redis_url: str) -> tuple[int, int, int]:
    import datetime as dt

    from gateway.tenancy.usage import UsageReader

    redis = _redis(redis_url)
    try:
        today = dt.datetime.now(dt.UTC).date()
        rows = await UsageReader(redis, prefix=PREFIX).read("tenant", ["ops-tenant"], today, today)
        return sum(r.requests for r in rows), sum(r.completion_tokens for r in rows), sum(r.errors for r in rows)
    finally:
        await redis.aclose()


def test_gateway_sigterm_drains_short_streams_and_ends_long_ones_settling_all(ops: Ops) -> None:
    requests_before, tokens_before, _ = asyncio.run(_usage(ops.redis_url))
    short: list[Any] = []
    long: list[Any] = []
    threads = [threading.Thread(target=stream_chat, args=(ops.base, ops.key, {**CHAT, "max_tokens": 2,
                                                                              "ignore_eos": True,
                                                                              "stream_options": {"include_usage": True}},
                                                          short)),
               threading.Thread(target=stream_chat, args=(ops.base, ops.key, {**CHAT, "max_tokens": 2000,
                                                                              "ignore_eos": True}, long))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not (_content_chunks(long) >= 1 and _content_chunks(short) >= 1):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ops.procs["gateway"].send_signal(signal.SIGTERM)
    termed = time.monotonic()
    # Both workers get the signal from uvicorn's supervisor, each a moment later: wait until four
    # answers in a row (new connections, spread over both workers) say draining.
    answers: list[int] = []
    while answers[-4:] != [503] * 4:
        assert time.monotonic() - termed < 3, answers
        answers.append(httpx.get(ops.base + "/ready").status_code)
        time.sleep(0.05)
    ready = httpx.get(ops.base + "/ready")
    assert ready.status_code == 503 and ready.json()["problems"][0].startswith("draining")
    refused = httpx.post(ops.base + "/v1/chat/completions", json=CHAT, headers=ops.headers())
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    for t in threads:
        t.join(60)
    assert short[-1][1] == "[DONE]" and _first_error(short) is None  # finished inside the drain time
    usage = next(e[1]["usage"] for e in short if e[0] == "data" and isinstance(e[1], dict) and e[1].get("usage"))
    error = _first_error(long)
    assert error is not None and "shutting down" in error[0]["message"]
    assert DRAIN_S - 0.5 < error[1] - termed < DRAIN_S + 5
    assert ops.procs["gateway"].wait(timeout=30) is not None
    requests_after, tokens_after, _ = asyncio.run(_usage(ops.redis_url))
    assert requests_after - requests_before == 2  # both settled; the refused one never was admitted
    long_tokens = tokens_after - tokens_before - usage["completion_tokens"]
    assert long_tokens > 0  # the cut stream is charged what it was sent
    assert asyncio.run(_conc_leases(ops.redis_url)) == 0
