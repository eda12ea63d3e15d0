"""Faults over real processes: clients that hang up anywhere, an engine SIGKILLed and restarted,
a Redis restart, a gateway SIGKILLed. Each ends in a clear error or a clean completion; afterwards
no KV block, lease or reservation is held, Redis's usage matches what the gateway sent, and the
service is back without anyone stepping in.

One module-scoped stack (redis-server with an append-only file, the engine with SmolLM2 at
--max-num-seqs 2 so a third request waits, one gateway with a 2 s lease). Tests run in file
order and each leaves the stack serving. Token counts are small: the suite's budget is tight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2E_DTYPE
from tests.gateway.tenancy.restartable_redis import RestartableRedis
from tests.support.fault_stack import START_TIMEOUT_S, Books, healthy, spawn, stop, wait_until
from tests.support.redis_server import free_port
from tests.support.tenant_keys import new_tenant_key

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PREFIX, TENANT = "faults", "faults-tenant"
SETTLE_S = 30.0
"""How long the books may take to settle after a fault (heartbeats, ZMTP timeouts, retries)."""


@dataclass
class FaultStack:
    base_url: str
    engine_address: str
    engine_args: list[str]
    gateway_args: list[str]
    key: str
    redis: RestartableRedis
    books: Books
    logs: Path
    procs: dict[str, Any]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def restart(self, name: str) -> None:
        args = self.engine_args if name == "engine" else self.gateway_args
        self.procs[name] = spawn(args, self.logs / f"{name}.log")
        wait_until(lambda: healthy(self.base_url), START_TIMEOUT_S, f"{name} back and /health 200")

    def settled(self) -> None:
        wait_until(self.books.nothing_held, SETTLE_S, "no lease, reservation or KV block held")


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultStack]:
    logs = Path(tempfile.mkdtemp(prefix="pageserve-faults-"))
    server = RestartableRedis()
    server.start()
    engine_address, port = f"tcp://127.0.0.1:{free_port()}", free_port()
    engine_args = ["engine", "--model", "smollm2", "--listen", engine_address, "--dtype", E2E_DTYPE,
                   "--kv-cache-memory", "0.3", "--max-num-seqs", "2"]
    gateway_args = ["gateway", "--engine", engine_address, "--port", str(port), "--model", "smollm2",
                    "--redis-prefix", PREFIX, "--engine-timeout", str(START_TIMEOUT_S), "--quota-lease", "2"]
    stack = FaultStack(f"http://127.0.0.1:{port}", engine_address, engine_args,
                       [*gateway_args, "--redis-url", server.url], asyncio.run(new_tenant_key(server.url, PREFIX, TENANT, "faults")), server,
                       Books(server.url, PREFIX, TENANT, engine_address), logs, {})
    try:
        stack.procs["engine"] = spawn(engine_args, logs / "engine.log")
        stack.restart("gateway")
        yield stack
    finally:
        for proc in stack.procs.values():
            stop(proc)
        stack.books.close()
        server.close()
        shutil.rmtree(logs, ignore_errors=True)


def completion(max_tokens: int, prompt: str | list[int] = "Once upon a time", **kw: Any) -> dict[str, Any]:
    return {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, **kw}


def events_of(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if line.startswith("data: "):
            yield "[DONE]" if line == "data: [DONE]" else json.loads(line[6:])


def read_stream(stack: FaultStack, body: dict[str, Any], stop_after: int | None = None,
                stop_at_finish: bool = False) -> list[Any]:
    """Stream a completion; hang up after `stop_after` events, or at the finish chunk (before usage/[DONE])."""
    seen: list[Any] = []
    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=body, headers=stack.headers(),
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        for event in events_of(r.iter_lines()):
            seen.append(event)
            if stop_after is not None and len(seen) >= stop_after:
                break
            if stop_at_finish and isinstance(event, dict) and event.get("choices") and \
                    event["choices"][0].get("finish_reason"):
                break
    return seen


def charged_per_request(stack: FaultStack) -> dict[str, int]:
    """completion tokens the gateway settled per request id (its one line per request, ids and counts only)."""
    text = (stack.logs / "gateway.log").read_text(errors="replace")
    return {m[1]: int(m[2]) for m in re.finditer(r"(cmpl-\w+) tenant=\S+ \S+ prompt=\d+ completion=(\d+)", text)}


def test_clients_that_hang_up_anywhere_leave_nothing_held(faults: FaultStack) -> None:
    before = faults.books.usage()
    # Before admission: headers and half a body, then gone.
    host, port = faults.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + faults.key.encode() + b"\r\nContent-Length: 500\r\n\r\n{\"model\":")
    # Two long streams fill the engine's two seats; a third waits, and its client leaves while it waits.
    long_body = completion(1000)  # seconds of decoding on any host: the seats stay taken
    with contextlib.ExitStack() as open_streams:
        readers = []  # held until the block ends: a collected line iterator closes its stream (a hang-up)
        for _ in range(2):
            r = open_streams.enter_context(httpx.stream("POST", f"{faults.base_url}/v1/completions", json=long_body,
                                                        headers=faults.headers(), timeout=120))
            readers.append(events_of(r.iter_lines()))
            next(readers[-1])  # running: tokens are flowing
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{faults.base_url}/v1/completions", json=completion(4), headers=faults.headers(),
                       timeout=0.5)

    # During prefill: a long prompt (~0.5-2 s of prefill on 2 cores), gone long before its first token.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{faults.base_url}/v1/completions", json=completion(4, prompt=[1] + [504] * 1500),
                   headers=faults.headers(), timeout=0.1)
    # Mid-stream, and at the last token (finish chunk read, [DONE] never read).
    cut = read_stream(faults, completion(40), stop_after=3)
    last = read_stream(faults, completion(6), stop_at_finish=True)
    # And two that complete, with usage.
    whole = [read_stream(faults, completion(5, stream_options={"include_usage": True})) for _ in range(2)]
    faults.settled()
    usage = [w[-2]["usage"]["completion_tokens"] for w in whole]
    assert usage == [5, 5] and whole[0][-1] == "[DONE]"
    assert last[-1]["choices"][0]["finish_reason"] == "length"
    # a request's line is logged after it settled (Redis, leases): the books can be clear a moment before it
    wait_until(lambda: len(charged_per_request(faults)) >= 8, SETTLE_S, "the gateway's line for every request")
    charged = charged_per_request(faults)
    assert charged[cut[0]["id"]] >= 2 and charged[last[0]["id"]] == 6
    requests, _, completion_tokens = faults.books.usage()
    # Redis holds exactly what the gateway settled for every admitted request (one line each; the
    # half-sent body was never admitted). This test runs first: nothing was recorded before it.
    assert before == (0, 0, 0)
    assert (requests, completion_tokens) == (len(charged), sum(charged.values())) and len(charged) == 8


def test_engine_sigkill_mid_stream_is_a_clear_error_and_a_restart_serves_again(faults: FaultStack) -> None:
    with httpx.stream("POST", f"{faults.base_url}/v1/completions", json=completion(300),
                      headers=faults.headers(), timeout=120) as r:
        events = events_of(r.iter_lines())
        next(events)
        faults.procs["engine"].send_signal(signal.SIGKILL)
        rest = list(events)
    assert rest and rest[-1]["error"]["type"] == "engine_unavailable" and "[DONE]" not in rest
    r = httpx.post(f"{faults.base_url}/v1/completions", json={**completion(2), "stream": False},
                   headers=faults.headers(), timeout=30)
    assert r.status_code == 503 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    wait_until(lambda: faults.books.leases() == 0 and faults.books.unsettled() == 0, SETTLE_S, "settled")
    faults.restart("engine")
    assert len(read_stream(faults, completion(3))) >= 2
    faults.settled()


def test_a_redis_restart_is_503_then_service_resumes_by_itself(faults: FaultStack) -> None:
    faults.redis.stop()
    r = httpx.post(f"{faults.base_url}/v1/completions", json=completion(2), headers=faults.headers(), timeout=30)
    assert r.status_code == 503 and faults.key not in r.text
    faults.redis.start()
    wait_until(lambda: healthy(faults.base_url), SETTLE_S, "/health 200 after Redis came back")
    assert read_stream(faults, completion(3))[-1] == "[DONE]"
    faults.settled()


def test_a_gateway_sigkill_frees_its_engine_requests_and_leases(faults: FaultStack) -> None:
    with httpx.stream("POST", f"{faults.base_url}/v1/completions", json=completion(300),
                      headers=faults.headers(), timeout=120) as r:
        events = events_of(r.iter_lines())
        next(events)
        faults.procs["gateway"].send_signal(signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):  # the connection is cut: no [DONE]
            list(events)
    faults.procs["gateway"].wait()
    # The engine aborts the dead gateway's requests; its lease runs out (2 s); its reservation
    # stays unsettled until the TTL: restart the gateway and check the engine and leases first.
    wait_until(faults.books.engine_idle, SETTLE_S, "engine aborted the dead gateway's request")
    wait_until(lambda: faults.books.leases() == 0, SETTLE_S, "lease expired")
    faults.restart("gateway")
    assert read_stream(faults, completion(2))[-1] == "[DONE]"


def test_no_key_or_prompt_text_in_any_log(faults: FaultStack) -> None:
    marker = "zebra-giraffe-secret-prompt-7731"
    read_stream(faults, completion(2, prompt=f"Tell me about {marker}"))
    time.sleep(0.3)
    for log in faults.logs.glob("*.log"):
        text = log.read_text(errors="replace")
        assert faults.key not in text and marker not in text, log.name
