"""LoRA adapters through real processes (issue 43, must-show 2, and the admin calls).

One stack for the module: the session's redis-server, an engine serving a tiny random Llama with
SmolLM2's vocabulary and tokenizer (tests/e2e/test_models.py's) with --enable-lora and two PEFT adapters
made by peft itself with random, non-zero A and B ("sql" for tenant alice, "poet" for tenant bob), and a
gateway with an admin token. The official OpenAI SDK streams; plain HTTP checks the refusals byte for
byte. Then the admin loads a third adapter at run time over the API, alice (allowed it) uses it, a reload
under the same name gets no stale prefix-cache block, a stream in flight outlives the unload
(`pageserve admin lora unload`, the CLI), and the adapter is then a 404.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.tenancy import TenantStore, connect
from gateway.tenancy.model_access import ModelAccess
from gateway.tenancy.usage import UsageReader
from tests.e2e.conftest import E2E_DTYPE, START_TIMEOUT_S, _stop, _wait_healthy
from tests.e2e.test_models import TINY, _tiny_with_tokenizer
from tests.support.fault_stack import spawn
from tests.support.lora_adapters import peft_adapter
from tests.support.model_routes import every_model_route
from tests.support.redis_server import free_port

TOKEN = "e2e-lora-admin-token"
PREFIX = "e2elora"
HI = [{"role": "user", "content": "Say hi"}]
LONG = [{"role": "user", "content": " ".join(f"word{i}" for i in range(60))}]  # several KV blocks


@dataclass
class LoraStack:
    base_url: str
    redis_url: str
    keys: dict[str, str]
    adapters: dict[str, Path]

    def post(self, path: str, body: dict[str, object], tenant: str) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=120,
                          headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def get(self, path: str, tenant: str) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=30, headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def admin(self, path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"})

    def sdk(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.keys[tenant], max_retries=0)


async def _tenants(redis_url: str) -> dict[str, str]:
    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=PREFIX, actor="e2e")
        keys = {}
        for name, models in (("alice", ["sql", "extra"]), ("bob", ["poet"])):
            await store.create_tenant(name, models=ModelAccess.of(models))
            keys[name] = (await store.create_key(name))[0]
        return keys
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def lora_stack(redis_url: str) -> Iterator[LoraStack]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-e2e-lora-"))
    tiny = _tiny_with_tokenizer(logs)
    adapters = {name: peft_adapter(tiny, logs / name, rank=rank, alpha=2 * rank, seed=seed, std=0.3)
                for name, rank, seed in (("sql", 4, 1), ("poet", 8, 2), ("extra", 2, 3), ("extra2", 2, 4),
                                         ("big", 32, 5))}
    engine_address, port = f"tcp://127.0.0.1:{free_port()}", free_port()
    procs = {
        "engine": spawn(["engine", "--model", str(tiny), "--listen", engine_address, "--dtype", E2E_DTYPE,
                         "--kv-cache-memory", "0.1", "--enable-lora", "--max-lora-rank", "16",
                         "--lora-modules", f"sql={adapters['sql']}", f"poet={adapters['poet']}"], logs / "engine.log"),
        "gateway": spawn(["gateway", "--engine", engine_address, "--model", str(tiny), "--redis-url", redis_url,
                          "--redis-prefix", PREFIX, "--port", str(port), "--engine-timeout", str(START_TIMEOUT_S)],
                         logs / "gateway.log", env={"PAGESERVE_ADMIN_TOKEN": TOKEN}),
    }
    try:
        keys = asyncio.run(_tenants(redis_url))
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base + "/health", procs, logs)
        yield LoraStack(base, redis_url, keys, adapters)
    finally:
        for proc in procs.values():
            _stop(proc)
        shutil.rmtree(logs, ignore_errors=True)


def _stream(stack: LoraStack, tenant: str, model: str, messages: list[dict[str, str]], **kw: object) -> list:
    return list(stack.sdk(tenant).chat.completions.create(model=model, messages=messages, stream=True,  # type: ignore[call-overload]
                                                          temperature=0, **kw))


def test_each_tenant_streams_its_adapter_and_the_others_is_absent(lora_stack: LoraStack) -> None:
    stack = lora_stack
    for tenant, mine, other in (("alice", "sql", "poet"), ("bob", "poet", "sql")):
        listed = stack.get("/v1/models", tenant).json()["data"]
        assert [(m["id"], m["parent"]) for m in listed] == [(mine, TINY)]
        chunks = _stream(stack, tenant, mine, HI, max_tokens=6)
        assert chunks and all(c.model == mine for c in chunks)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.NotFoundError) as refused:
            _stream(stack, tenant, other, HI, max_tokens=2)
        assert refused.value.code == "model_not_found"
        hidden, absent = every_model_route(stack, other, tenant), every_model_route(stack, "no-such", tenant)
        assert {status for status, _ in hidden} == {404}
        assert hidden == [(s, body.replace(b"no-such", other.encode())) for s, body in absent]


def test_the_admin_routes_refuse_a_tenant_and_name_a_bad_adapter(lora_stack: LoraStack) -> None:
    stack = lora_stack
    body = {"lora_name": "big", "lora_path": str(stack.adapters["big"])}
    r = stack.post("/v1/load_lora_adapter", body, "alice")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
    r = stack.admin("/v1/load_lora_adapter", body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "invalid_lora_adapter" and error["param"] == "lora_path"
    assert "rank 32 is over --max-lora-rank 16" in error["message"], error
    r = stack.admin("/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": str(stack.adapters["big"]) + "-no"})
    assert r.status_code == 400 and "no adapter_config.json" in r.json()["error"]["message"]
    assert "big" not in [m["id"] for m in httpx.get(stack.base_url + "/v1/models", timeout=10, headers={
        "Authorization": f"Bearer {stack.keys['alice']}"}).json()["data"]]


def _cached(stack: LoraStack, model: str) -> int:
    r = stack.post("/v1/chat/completions", {"model": model, "messages": LONG, "max_tokens": 2, "temperature": 0},
                   "alice")
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _cli(stack: LoraStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PAGESERVE_ADMIN_TOKEN": TOKEN, "PAGESERVE_GATEWAY_URL": stack.base_url}
    return subprocess.run([sys.executable, "-m", "ops.cli", "admin", "lora", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_runtime_adapter_loads_serves_reloads_fresh_and_unloads_under_a_running_stream(lora_stack: LoraStack) -> None:
    stack = lora_stack
    r = stack.admin("/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(stack.adapters["extra"])})
    assert r.status_code == 200 and r.json()["status"] == "loaded", r.text
    assert "extra" in [m["id"] for m in stack.get("/v1/models", "alice").json()["data"]]  # at once, on answering
    chunks = _stream(stack, "alice", "extra", HI, max_tokens=4)
    assert chunks and all(c.model == "extra" for c in chunks)
    _cached(stack, "extra")
    assert _cached(stack, "extra") > 0  # the same load shares its blocks
    assert stack.admin("/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(stack.adapters["extra2"])}
                       ).status_code == 200  # a reload under the same name: a new load
    assert _cached(stack, "extra") == 0  # no block computed under the first load is reused

    stream = stack.sdk("alice").chat.completions.create(model="extra", messages=HI, stream=True, max_tokens=300,
                                                        extra_body={"ignore_eos": True})
    first = next(iter(stream))
    done = _cli(stack, "unload", "extra")
    assert done.returncode == 0 and "adapter extra unloaded" in done.stdout and TOKEN not in done.stdout + done.stderr
    rest = list(stream)  # admitted before the unload: it finishes on its weights
    assert first.model == "extra" and rest[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.NotFoundError) as gone:
        _stream(stack, "alice", "extra", HI, max_tokens=2)
    assert gone.value.code == "model_not_found"
    assert [m["id"] for m in stack.get("/v1/models", "alice").json()["data"]] == ["sql"]
    assert _cli(stack, "unload", "extra").returncode == 1


def _metric_samples(stack: LoraStack) -> list:
    text = httpx.get(stack.base_url + "/metrics", timeout=10).text
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_usage_and_metrics_per_adapter(lora_stack: LoraStack) -> None:
    stack = lora_stack
    # the engine's figures on /metrics are its last polled Stats: wait for the poll after the loads and the
    # unload above (a loaded host polled between them once: 3 adapters loaded)
    deadline = time.monotonic() + 10
    while True:
        samples = _metric_samples(stack)
        loads = sum(s.value for s in samples if s.name == "pageserve:lora_load_seconds_count")
        loaded = sum(s.value for s in samples if s.name == "pageserve:lora_adapters_loaded")
        if (loads >= 4 and loaded == 2) or time.monotonic() > deadline:  # and the poll after the unload
            break
        time.sleep(0.2)

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())

    assert [s.labels["max_lora"] for s in samples if s.name == "vllm:lora_requests_info"] == ["4"]
    for adapter in ("sql", "poet"):  # alice's and bob's streams, each under its adapter's name
        assert value("vllm:request_success_total", model_name=adapter) >= 1
    assert value("vllm:request_generation_tokens_sum", model_name="extra") > 0
    assert value("pageserve:lora_load_seconds_count") >= 4  # sql and poet at start-up, extra and its reload
    assert value("pageserve:lora_adapters_loaded") == 2 and value("pageserve:lora_adapters_resident") >= 2

    async def models_used() -> set[str]:
        redis = connect(stack.redis_url)
        try:
            today = dt.datetime.now(dt.UTC).date()
            return {r.model or "" for r in await UsageReader(redis, PREFIX).read_models("alice", today, today)}
        finally:
            await redis.aclose()

    assert {"sql", "extra"} <= asyncio.run(models_used())  # usage records per adapter
