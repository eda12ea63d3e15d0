"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (issue 43) against a fake engine that loads by
changing the adapters it announces, as a real one's ModelUpdate does before its reply: the admin token
guard (a tenant key is a 401, no token configured a 404), the catalog following loads and unloads,
engine refusals as OpenAI-shaped 400/404 bodies naming the problem, and every replica of the base told."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.errors import APIError
from gateway.lora_admin import _engines, _of_base, _refusal
from shared.model_info import AdapterInfo
from shared.protocol import MODEL_NOT_FOUND, REQUEST_REJECTED, AdapterReply
from tests.gateway.fakes import MODEL_INFO

TOKEN = "lora-admin-token-for-tests"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def lora_gateway(make_gateway: Any) -> Any:
    """A gateway whose fake engine serves loads: a path ending in "bad" is refused as a real engine would."""
    gw = make_gateway(admin_token=TOKEN)
    engine = gw.engine
    engine.address, engine.calls = "tcp://fake:1", []

    async def load_adapter(name: str, path: str) -> AdapterReply:
        engine.calls.append(("load", name, path))
        if path.endswith("bad"):
            return AdapterReply("c", f"{path}: layers.0.q_proj: rank 128 is over --max-lora-rank 64", REQUEST_REJECTED)
        adapters = tuple(a for a in engine.model_info.adapters if a.name != name) + (AdapterInfo(name, "smollm2"),)
        engine.model_info = dataclasses.replace(engine.model_info, adapters=adapters)
        return AdapterReply("c", load_id=len(engine.calls))

    async def unload_adapter(name: str) -> AdapterReply:
        engine.calls.append(("unload", name))
        adapters = tuple(a for a in engine.model_info.adapters if a.name != name)
        engine.model_info = dataclasses.replace(engine.model_info, adapters=adapters)
        return AdapterReply("c")

    engine.load_adapter, engine.unload_adapter = load_adapter, unload_adapter
    return gw


def test_only_the_admin_token_reaches_the_routes(make_gateway: Any) -> None:
    gw = lora_gateway(make_gateway)
    body = {"lora_name": "sql", "lora_path": "/adapters/sql"}
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        for headers in ({"Authorization": f"Bearer {gw.key}"}, {}, {"Authorization": "Bearer wrong"}):
            r = gw.client.post(path, json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token", r.text
    assert gw.engine.calls == []
    disabled = make_gateway()  # no admin token configured: the routes do not exist for anyone
    r = disabled.client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def test_load_serves_the_adapter_at_once_and_unload_makes_it_absent(make_gateway: Any) -> None:
    gw = lora_gateway(make_gateway)
    r = gw.client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/adapters/sql"},
                       headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"object": "lora_adapter", "lora_name": "sql",
                                                 "base_model": "smollm2", "status": "loaded", "engines": 1}
    listed = gw.client.get("/v1/models", headers={"Authorization": f"Bearer {gw.key}"}).json()["data"]
    assert ("sql", "smollm2") in [(m["id"], m.get("parent")) for m in listed]
    r = gw.post("/v1/chat/completions", {**CHAT, "model": "sql"})
    assert r.status_code == 200 and r.json()["model"] == "sql" and gw.engine.submitted[-1].lora_name == "sql"
    r = gw.client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "unloaded"
    r = gw.post("/v1/chat/completions", {**CHAT, "model": "sql"})  # absent now, not "retry later"
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = gw.client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"
    assert gw.engine.calls == [("load", "sql", "/adapters/sql"), ("unload", "sql")]


def test_a_bad_adapter_or_body_is_a_400_naming_the_problem(make_gateway: Any) -> None:
    gw = lora_gateway(make_gateway)
    r = gw.client.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": "/adapters/bad"},
                       headers=ADMIN)
    assert r.status_code == 400 and r.json() == {"error": {
        "message": "/adapters/bad: layers.0.q_proj: rank 128 is over --max-lora-rank 64",
        "type": "invalid_request_error", "param": "lora_path", "code": "invalid_lora_adapter"}}
    for body, param in (({"lora_name": "sql"}, "lora_path"), ({"lora_path": "/a"}, "lora_name"),
                        ({"lora_name": "sql", "lora_path": "/a", "base_model": "other"}, "base_model")):
        r = gw.client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert [c[1] for c in gw.engine.calls] == ["big"]


@dataclasses.dataclass
class Engine:
    address: str


@pytest.mark.parametrize(("reply", "status", "code"), [
    (AdapterReply("c"), None, None),
    (AdapterReply("c", "the adapter 'sql' is not loaded", MODEL_NOT_FOUND), 404, "model_not_found"),
    (AdapterReply("c", "no adapter_model.safetensors", REQUEST_REJECTED), 400, "invalid_lora_adapter"),
    (TimeoutError(), 503, "engine_unavailable"),
])
def test_with_several_engines_the_first_refusal_names_its_engine(reply: Any, status: int | None, code: str) -> None:
    ok = (Engine("tcp://a:1"), AdapterReply("c"))
    error = _refusal([ok, (Engine("tcp://b:2"), reply)], several=True)  # type: ignore[list-item]
    if status is None:
        assert error is None
    else:
        assert error is not None and (error.status_code, error.code) == (status, code)
        assert error.message.startswith("engine tcp://b:2: ")


def test_a_load_goes_to_every_live_replica_of_the_base_model() -> None:
    @dataclasses.dataclass
    class Client:
        address: str
        model_info: Any

    @dataclasses.dataclass
    class Replica:
        client: Client

    clients = [Client(f"tcp://{i}:1", dataclasses.replace(MODEL_INFO, model_name=base))
               for i, base in enumerate(("smollm2", "tiny", "smollm2"))]

    class Replicas:
        def live(self) -> list[Replica]:
            return [Replica(c) for c in clients]

    engines = _engines(Replicas())
    assert _of_base(engines, "smollm2") == ("smollm2", [clients[0], clients[2]])  # type: ignore[comparison-overlap]
    with pytest.raises(APIError, match="several base models"):
        _of_base(engines, None)
    assert _of_base(engines[1:2], None) == ("tiny", [clients[1]])  # type: ignore[comparison-overlap]
