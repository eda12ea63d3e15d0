"""`pageserve admin lora` against a stubbed gateway answer: the body it sends, exit codes, what it prints.
(The real route behind it: tests/gateway/test_lora_admin.py; through real processes: tests/e2e/test_lora.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ops import admin_lora
from ops.admin import main as admin_main

TOKEN = "cli-admin-token"


def stub(monkeypatch: pytest.MonkeyPatch, status: int, body: dict[str, Any]) -> list[tuple[str, str, dict]]:
    calls: list[tuple[str, str, dict]] = []

    def call(url: str, token: str, path: str, sent: dict[str, str]) -> httpx.Response:
        calls.append((url + path, token, sent))
        return httpx.Response(status, json=body)

    monkeypatch.setattr(admin_lora, "_call", call)
    monkeypatch.setenv("PAGESERVE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("PAGESERVE_GATEWAY_URL", "http://gw:8000")
    return calls


def test_load_and_unload_call_the_admin_routes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    done = {"object": "lora_adapter", "lora_name": "sql", "base_model": "smollm2", "status": "loaded", "engines": 2}
    calls = stub(monkeypatch, 200, done)
    assert admin_main(["lora", "load", "sql", "/adapters/sql"]) == 0
    assert admin_main(["lora", "unload", "sql", "--base-model", "smollm2"]) == 0
    assert calls == [("http://gw:8000/v1/load_lora_adapter", TOKEN, {"lora_name": "sql", "lora_path": "/adapters/sql"}),
                     ("http://gw:8000/v1/unload_lora_adapter", TOKEN, {"lora_name": "sql", "base_model": "smollm2"})]
    out = capsys.readouterr()
    assert "adapter sql loaded on 2 engine(s) of smollm2" in out.out and TOKEN not in out.out + out.err


def test_a_refusal_exits_1_with_the_gateways_words(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    stub(monkeypatch, 400, {"error": {"message": "/a: rank 128 is over --max-lora-rank 64", "code": "invalid_lora_adapter"}})
    assert admin_main(["lora", "load", "big", "/a"]) == 1
    assert "400: /a: rank 128 is over --max-lora-rank 64" in capsys.readouterr().err
    stub(monkeypatch, 503, {"error": {"message": "no engine is reachable"}})
    assert admin_main(["lora", "unload", "big"]) == 3


def test_without_the_token_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub(monkeypatch, 200, {})
    monkeypatch.delenv("PAGESERVE_ADMIN_TOKEN")
    assert admin_main(["lora", "load", "sql", "/a"]) == 2 and calls == []
