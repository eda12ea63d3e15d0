"""Two models behind one gateway with real processes (issue 42, must-show 1 and 3).

One stack for the module: the session's redis-server, an engine serving
SmolLM2 ("smollm2"), an engine serving a tiny random Llama folder
("tiny-llama", SmolLM2's tokenizer beside random weights), one gateway routing
to both with a fallback tiny-llama -> smollm2. Tenants: "small" (smollm2 only),
"both" ("*"), "tiny-only". The official OpenAI SDK streams; plain HTTP checks
the refusals byte for byte. The last test stops the tiny engine.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.tenancy import TenantStore, connect
from gateway.tenancy.model_access import ModelAccess
from shared.model_store import resolve_model
from tests.e2e.conftest import E2E_DTYPE, START_TIMEOUT_S, _spawn, _stop, _wait_healthy
from tests.support.model_routes import every_model_route
from tests.support.redis_server import free_port
from tests.support.tiny_model import tiny_llama_folder

SMALL, TINY = "smollm2", "tiny-llama"
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


@dataclass
class TwoModelStack:
    base_url: str
    keys: dict[str, str]
    engines: dict[str, object]

    def post(self, path: str, body: dict[str, object], tenant: str) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=120,
                          headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def get(self, path: str, tenant: str) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=30, headers={"Authorization": f"Bearer {self.keys[tenant]}"})


def _tiny_with_tokenizer(root: Path) -> Path:
    """A random Llama whose vocabulary is SmolLM2's, with SmolLM2's tokenizer files beside it."""
    folder = tiny_llama_folder(root / TINY, vocab_size=49152, num_layers=2, eos_token_id=2)
    source = resolve_model(SMALL).path
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


async def _tenants(redis_url: str, prefix: str) -> dict[str, str]:
    redis = connect(redis_url)
    try:
        store = TenantStore(redis, prefix=prefix, actor="e2e")
        keys = {}
        for name, access in (("small", ModelAccess.of([SMALL])), ("both", ModelAccess.parse("*")),
                             ("tiny-only", ModelAccess.of([TINY]))):
            await store.create_tenant(name, models=access)
            keys[name] = (await store.create_key(name))[0]
        return keys
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def models_stack(redis_url: str) -> Iterator[TwoModelStack]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-e2e-models-"))
    tiny = _tiny_with_tokenizer(logs)
    addresses = {m: f"tcp://127.0.0.1:{free_port()}" for m in (SMALL, TINY)}
    port, prefix = free_port(), "e2emodels"
    procs = {f"engine-{m}": _spawn(["engine", "--model", spec, "--listen", addresses[m], "--dtype", E2E_DTYPE,
                                    "--kv-cache-memory", "0.1"], logs / f"engine-{m}.log")
             for m, spec in ((SMALL, SMALL), (TINY, str(tiny)))}
    procs["gateway"] = _spawn(["gateway", "--engine", addresses[SMALL], "--engine", addresses[TINY],
                               "--model", SMALL, "--model", str(tiny), "--model-fallback", f"{TINY}={SMALL}",
                               "--redis-url", redis_url, "--redis-prefix", prefix, "--port", str(port),
                               "--engine-timeout", str(START_TIMEOUT_S)], logs / "gateway.log")
    try:
        keys = asyncio.run(_tenants(redis_url, prefix))
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base + "/health", procs, logs)
        stack = TwoModelStack(base, keys, {m: procs[f"engine-{m}"] for m in (SMALL, TINY)})
        _wait_for_models(stack)
        yield stack
    finally:
        for proc in procs.values():
            _stop(proc)
        shutil.rmtree(logs, ignore_errors=True)


def _wait_for_models(stack: TwoModelStack) -> None:
    """Healthy means one replica; wait until both engines joined (a configured model is listed, and
    answers 503, before its engine joins)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for model in (SMALL, TINY):
        while stack.post("/tokenize", {"model": model, "prompt": "hi"}, "both").status_code != 200:
            assert time.monotonic() < deadline, f"the engine of {model} never joined"
            time.sleep(0.3)



def test_a_tenant_sees_streams_and_is_refused_by_its_model_list(models_stack: TwoModelStack) -> None:
    stack = models_stack
    assert [m["id"] for m in stack.get("/v1/models", "small").json()["data"]] == [SMALL]
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=stack.keys["small"], max_retries=0)
    chunks = list(client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "Say hi"}],
                                                 max_tokens=4, stream=True))
    assert chunks and all(c.model == SMALL for c in chunks)
    hidden = every_model_route(stack, TINY, "small")
    absent = every_model_route(stack, "no-such-model", "small")
    assert {status for status, _ in hidden} == {404}
    assert hidden == [(s, body.replace(b"no-such-model", TINY.encode())) for s, body in absent]
    for model in (SMALL, TINY):  # a tenant allowed both uses both
        r = stack.post("/v1/chat/completions", {**CHAT, "model": model}, "both")
        assert r.status_code == 200 and r.json()["model"] == model, r.text


def test_a_stopped_model_is_503_or_falls_back_while_the_other_serves(models_stack: TwoModelStack) -> None:
    stack = models_stack
    stack.engines[TINY].send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    stack.engines[TINY].wait(timeout=60)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while True:  # the replica set evicts the stopped engine at its next pass
        r = stack.post("/v1/chat/completions", {**CHAT, "model": TINY}, "tiny-only")
        if r.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    # no fallback the tenant may use: 503 with Retry-After, never the other model
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "model_unavailable"
    # a tenant allowed the fallback is answered by it on the first try
    started = time.monotonic()
    r = stack.post("/v1/chat/completions", {**CHAT, "model": TINY}, "both")
    assert r.status_code == 200 and r.json()["model"] == SMALL, r.text
    assert time.monotonic() - started < 10
    assert stack.post("/v1/chat/completions", {**CHAT, "model": SMALL}, "small").status_code == 200
