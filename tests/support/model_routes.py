"""Every route that names a model, called the same way by the unit and the end-to-end tests of the one
model-access decision (gateway/tenancy/model_access.py): a hidden model must answer exactly like an absent
one on each, so adding a route that takes `model` means adding it here once."""

from __future__ import annotations

from typing import Any, Protocol


class TenantClient(Protocol):
    """A test harness that calls the gateway as one of its tenants."""

    def get(self, path: str, tenant: str) -> Any: ...

    def post(self, path: str, body: dict[str, Any], tenant: str) -> Any: ...


def every_model_route(client: TenantClient, model: str, tenant: str) -> list[tuple[int, bytes]]:
    """(status, body bytes) of each route asked about `model` by `tenant`."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "model": model}
    calls = [client.get(f"/v1/models/{model}", tenant),
             client.post("/v1/chat/completions", chat, tenant),
             client.post("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}, tenant),
             client.post("/tokenize", {"model": model, "prompt": "hi"}, tenant),
             client.post("/detokenize", {"model": model, "tokens": [1]}, tenant)]
    return [(r.status_code, r.content) for r in calls]
