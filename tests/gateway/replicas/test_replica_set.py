"""The replica set and router over real engine loops (the fake core, real ZeroMQ): routing,
failover before the first token, a clear end after it, stall eviction, and rejoining."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.serving.server import EngineServer, ServerConfig
from gateway.engine_client import EngineDeadError
from gateway.metrics import GatewayMetrics, render
from gateway.replicas import observe_routing, replica_loads, routing_metrics
from gateway.replicas.config import ReplicasConfig
from gateway.replicas.failover import FailoverStream
from gateway.replicas.policy import RoutingConfig, rendezvous_order
from gateway.replicas.replica_set import ReplicaSet
from gateway.routing_metrics import ReplicaCollector
from shared.block_hash import prefix_hash
from shared.protocol import AddRequest, Finished, TokenDelta
from shared.sampling import SamplingParams
from tests.engine.serving.fake_core import INFO, FakeCore
from tests.support.redis_server import free_port

pytestmark = pytest.mark.anyio
ROUTING = RoutingConfig(affinity_blocks=2)


class Engine:
    def __init__(self, address: str | None = None, grace_s: float = 0.1) -> None:
        self.core = FakeCore()
        self.server = EngineServer(self.core, INFO, ServerConfig(listen=address or f"tcp://127.0.0.1:{free_port()}",
                                                                 shutdown_grace_s=grace_s, close_linger_ms=100))
        self.address = self.server.address
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    async def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.core.step_gate.set()
        self.server.request_stop()
        await asyncio.to_thread(self.thread.join, 5)


def config(*addresses: str, stall_timeout_s: float = 5.0) -> ReplicasConfig:
    return ReplicasConfig(addresses=addresses, routing=ROUTING, probe_interval_s=0.1,
                          stall_timeout_s=stall_timeout_s, handshake_timeout_s=0.5)


def request(rid: str, prompt: list[int], salt: str = "", max_tokens: int = 3) -> AddRequest:
    return AddRequest(rid, prompt, SamplingParams(max_tokens=max_tokens), cache_salt=salt)


async def drain(stream: FailoverStream) -> list[TokenDelta | Finished]:
    return [item async for item in stream]


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def two() -> AsyncIterator[tuple[Engine, Engine, ReplicaSet]]:
    a, b = Engine(), Engine()
    replicas = ReplicaSet(config(a.address, b.address, stall_timeout_s=1.0))
    await replicas.start(timeout_s=10)
    await until(lambda: len(replicas.live()) == 2, 5)
    yield a, b, replicas
    await replicas.close()
    await a.stop()
    await b.stop()


def exported(replicas: ReplicaSet, metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows of the routing: sample name and labels -> value."""
    text = render(metrics, ReplicaCollector(lambda: replica_loads(replicas))).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith(("pageserve:router", "pageserve:replica", "pageserve:live"))}


def affine(prompt: list[int], salt: str, addresses: list[str]) -> str:
    key = prefix_hash(prompt, salt, INFO.block_size, ROUTING.affinity_blocks)
    assert key is not None
    return rendezvous_order(key, addresses)[0]


async def test_requests_sharing_a_prefix_meet_on_their_affine_replica(two: tuple[Engine, Engine, ReplicaSet]) -> None:
    a, b, replicas = two
    router = replicas.router
    prometheus = GatewayMetrics()
    assert observe_routing(replicas, prometheus.routing) and not observe_routing(object(), prometheus.routing)
    for salt in ("t1", "t2", "t3", "t4"):
        prompt = [7, 8, 9, 10, 11, 12, 13, 14, 15]
        served = set()
        for i in range(3):
            stream = await router.submit(request(f"{salt}-{i}", prompt + [i], salt))
            assert [type(x) for x in await drain(stream)][-1] is Finished
            served.add(stream.replica)
        assert served == {affine(prompt, salt, [a.address, b.address])}
    assert replicas.counters.decisions["affinity"] == 12
    assert sum(replicas.counters.routed.values()) == 12
    metrics = routing_metrics(replicas)
    assert metrics is not None and metrics["live_replicas"] == 2 and metrics["decisions"] == {"affinity": 12}
    assert set(metrics["replicas"]) == {a.address, b.address}  # type: ignore[call-overload]
    assert routing_metrics(object()) is None  # the single engine link has none
    shown = exported(replicas, prometheus)
    decisions = {dict(labels)["replica"]: v for (name, labels), v in shown.items()
                 if name == "pageserve:router_decisions_total" and dict(labels)["reason"] == "affinity"}
    assert sum(decisions.values()) == 12 and set(decisions) <= {a.address, b.address}
    assert decisions == {k: float(v) for k, v in replicas.counters.routed.items()}
    assert shown[("pageserve:live_replicas", ())] == 2
    for gauge in ("pageserve:replica_requests_waiting", "pageserve:replica_requests_running"):
        assert {dict(labels)["replica"] for (name, labels) in shown if name == gauge} == {a.address, b.address}
    assert shown[("pageserve:router_retries_total", ())] == 0
    total = await router.stats()  # the replicas' stats added up
    assert total.num_finished == 12 and total.num_gateways == 2 and total.num_total_blocks == 2 * INFO.num_blocks
    assert router.model_info.model_name == "fake"


async def test_a_short_prompt_goes_by_load(two: tuple[Engine, Engine, ReplicaSet]) -> None:
    stream = await two[2].router.submit(request("short", [1, 2, 3]))
    await drain(stream)
    assert two[2].counters.decisions["load"] == 1


async def test_a_stalled_replica_leaves_and_its_unstarted_request_moves(two: tuple[Engine, Engine, ReplicaSet]) -> None:
    a, b, replicas = two
    metrics = GatewayMetrics()
    observe_routing(replicas, metrics.routing)
    prompt = list(range(20, 40))
    home = affine(prompt, "", [a.address, b.address])
    stuck, other = (a, b) if home == a.address else (b, a)
    stuck.core.step_gate.clear()  # its loop hangs inside a step: no token, no stats answer
    started = time.monotonic()
    stream = await replicas.router.submit(request("r1", prompt, max_tokens=4))
    assert stream.replica == stuck.address
    items = await asyncio.wait_for(drain(stream), 10)
    assert time.monotonic() - started < 4  # the stall window (1 s) plus a probe, not the 5 s gate
    assert stream.replica == other.address
    assert sum(len(x.new_token_ids) for x in items if isinstance(x, TokenDelta)) == 4
    assert replicas.counters.retries == 1 and replicas.counters.evictions["stalled"] == 1
    shown = exported(replicas, metrics)
    assert shown[("pageserve:router_retries_total", ())] == 1
    assert shown[("pageserve:replica_evictions_total", (("reason", "stalled"),))] == 1
    assert shown[("pageserve:live_replicas", ())] == 1
    assert [r.address for r in replicas.live()] == [other.address]
    stuck.core.step_gate.set()  # it recovers: the next handshake brings it back
    await until(lambda: len(replicas.live()) == 2, 5)


async def test_a_request_that_sent_tokens_ends_with_an_error_not_a_retry(
        two: tuple[Engine, Engine, ReplicaSet]) -> None:
    a, b, replicas = two
    stream = await replicas.router.submit(request("long", list(range(50, 70)), max_tokens=5000))
    first = await stream.__anext__()
    assert isinstance(first, TokenDelta)
    engine = a if stream.replica == a.address else b
    await engine.stop()  # graceful stop: grace 0.1 s, then the request is aborted
    with pytest.raises(EngineDeadError):
        async for item in stream:
            if isinstance(item, Finished):
                assert item.reason == "abort"
                raise EngineDeadError("aborted")  # what Generation turns into a 503
    assert replicas.counters.retries == 0


async def test_a_stopping_replica_refuses_and_the_request_goes_elsewhere(
        two: tuple[Engine, Engine, ReplicaSet]) -> None:
    a, b, replicas = two
    prompt = list(range(100, 120))
    home = a if affine(prompt, "", [a.address, b.address]) == a.address else b
    other = b if home is a else a
    home.core.step_gate.clear()
    home.server.request_stop()  # draining: it answers new requests with "shutting down"
    await until(lambda: home.server._stop_deadline is not None, 2)
    stream = await replicas.router.submit(request("moved", prompt))
    items = await asyncio.wait_for(drain(stream), 5)
    assert stream.replica == other.address and isinstance(items[-1], Finished) and items[-1].reason == "length"
    assert replicas.counters.retries == 1


async def test_with_no_replica_left_the_request_fails_cleanly(two: tuple[Engine, Engine, ReplicaSet]) -> None:
    a, b, replicas = two
    metrics = GatewayMetrics()
    observe_routing(replicas, metrics.routing)
    a.core.step_gate.clear()
    b.core.step_gate.clear()
    stream = await replicas.router.submit(request("doomed", list(range(200, 220))))
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(drain(stream), 10)
    assert replicas.counters.retries == 1 and replicas.counters.failovers_exhausted == 1
    shown = exported(replicas, metrics)
    assert shown[("pageserve:router_failovers_exhausted_total", ())] == 1
    assert shown[("pageserve:router_retries_total", ())] == 1
    assert replicas.client is None  # the gateway answers 503 until one comes back


async def test_waits_for_late_engines_and_follows_a_restart() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    replicas = ReplicaSet(config(address))
    starting = asyncio.create_task(replicas.start(timeout_s=10))
    await asyncio.sleep(0.3)
    assert not starting.done() and replicas.client is None
    engine = Engine(address)
    await asyncio.wait_for(starting, 5)
    await engine.stop()
    await until(lambda: replicas.client is None, 5)
    engine = Engine(address)  # systemd restarts it on the same address
    await until(lambda: replicas.client is not None, 5)
    assert replicas.counters.evictions["dead"] == 1
    await replicas.close()
    await engine.stop()
