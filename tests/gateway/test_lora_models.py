"""LoRA adapters through the gateway, against a fake engine that announces them: /v1/models lists each
with `parent` set to the base model, a body's `model` naming one reaches the engine as lora_name (and the
response echoes it), and unknown names, or an adapter the engine unloaded since, are 404 model_not_found."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.engine_client import RequestFailedError
from shared.model_info import AdapterInfo
from shared.protocol import MODEL_NOT_FOUND
from tests.gateway.conftest import echo_script
from tests.gateway.fakes import MODEL_INFO, Script

WITH_ADAPTERS = dataclasses.replace(MODEL_INFO, adapters=(AdapterInfo("sql", "smollm2"), AdapterInfo("poet", "smollm2")))


def test_models_list_adapters_with_their_parent(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.model_info = WITH_ADAPTERS
    auth = {"Authorization": f"Bearer {gw.key}"}
    data = gw.client.get("/v1/models", headers=auth).json()["data"]
    assert sorted((m["id"], m.get("parent") or "") for m in data) == [("poet", "smollm2"), ("smollm2", ""),
                                                                      ("sql", "smollm2")]
    assert gw.client.get("/v1/models/poet", headers=auth).json()["parent"] == "smollm2"


def test_a_body_naming_an_adapter_runs_it(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.engine.model_info = WITH_ADAPTERS
    r = gw.post("/v1/completions", {"model": "sql", "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["model"] == "sql"
    assert gw.engine.submitted[-1].lora_name == "sql"
    gw.post("/v1/completions", {"model": "smollm2", "prompt": "hi", "max_tokens": 4})
    assert gw.engine.submitted[-1].lora_name == ""
    missing = gw.post("/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 4})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_an_adapter_unloaded_since_ready_is_a_404(make_gateway: Any) -> None:
    def unloaded(request: Any) -> Script:
        return dataclasses.replace(echo_script(request), samples=[[]],
                                   fail=RequestFailedError("the model 'sql' does not exist", MODEL_NOT_FOUND, "model"))

    gw = make_gateway(unloaded)
    gw.engine.model_info = WITH_ADAPTERS
    r = gw.post("/v1/chat/completions", {"model": "sql", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
