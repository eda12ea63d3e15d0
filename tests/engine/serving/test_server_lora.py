"""Admin calls on LoRA adapters through the engine loop (issue 43), with a fake core in a thread.

The read of an adapter is held on a gate: the test sees running streams keep stepping meanwhile
(the read is off the loop), then every gateway told the new model facts before the caller's reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import zmq

from engine.serving.server import EngineServer, ServerConfig
from engine.worker.lora.errors import LoraError
from engine.worker.lora.reader import LoraReader
from engine.worker.lora.registry import LoraRegistry
from gateway.engine_client import EngineClient
from shared.model_info import AdapterInfo, ModelInfo
from shared.protocol import (
    MODEL_NOT_FOUND,
    REQUEST_REJECTED,
    AdapterReply,
    LoadAdapter,
    ModelUpdate,
    StepOutputs,
    UnloadAdapter,
)
from tests.engine.serving.fake_core import INFO, FakeCore, Running, add
from tests.support.raw_gateway import RawGateway


@dataclass(frozen=True)
class FakeAdapter:
    name: str
    path: str
    load_id: int


class LoraCore(FakeCore):
    """FakeCore with the real core's LoRA admin methods over the real registry; its loader makes a
    FakeAdapter, waiting on `read_gate` first, and fails for the path "bad"."""

    def __init__(self) -> None:
        super().__init__()
        self.model_info = INFO
        self.registry = LoraRegistry(self._read, max_cpu_loras=4)  # type: ignore[arg-type]
        self.lora_reader = LoraReader()
        self.read_gate = threading.Event()
        self.read_gate.set()
        self.read_threads: list[str] = []
        self.only_reads = False
        """What `waits_only_on_reads` answers (EngineCore: its last step was empty, a read is pending)."""

    def waits_only_on_reads(self) -> bool:
        return self.only_reads

    def _read(self, path: str, name: str, load_id: int) -> FakeAdapter:
        self.read_threads.append(threading.current_thread().name)
        assert self.read_gate.wait(10.0)
        if path == "bad":
            raise LoraError("bad: layers.0.q_proj: rank 128 is over --max-lora-rank 64")
        return FakeAdapter(name, path, load_id)

    def reserve_lora(self, name: str) -> int:
        return self.registry.reserve(name)

    def read_lora(self, path: str, name: str, load_id: int) -> FakeAdapter:
        return self.registry.read(path, name, load_id)  # type: ignore[return-value]

    def install_lora(self, name: str, path: str, adapter: FakeAdapter, seconds: float) -> None:
        self.registry.install(name, path, adapter, seconds)  # type: ignore[arg-type]
        self._refresh()

    def unload_lora(self, name: str) -> None:
        self.registry.unload(name)
        self._refresh()

    def _refresh(self) -> None:
        adapters = tuple(AdapterInfo(n, INFO.model_name) for n in self.registry.names())
        self.model_info = dataclasses.replace(INFO, adapters=adapters)


@pytest.fixture
def lora_engine() -> Iterator[Running]:
    core = LoraCore()
    server = EngineServer(core, INFO, ServerConfig(listen="tcp://127.0.0.1:*", shutdown_grace_s=0.2,
                                                   close_linger_ms=500))
    updates: list[ModelInfo] = []
    server.on_model_update = updates.append
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(server.serve()), daemon=True)
    thread.start()
    running = Running(server, core, thread, exit_code)
    running.updates = updates  # type: ignore[attr-defined]
    yield running
    core.read_gate.set()
    running.stop()


def _recv_not_steps(gw: RawGateway) -> object:
    while isinstance(msg := gw.recv(), StepOutputs):
        pass
    return msg


def test_a_load_reads_off_the_loop_while_streams_step_then_everyone_hears(lora_engine: Running,
                                                                         ctx: zmq.Context) -> None:
    core: LoraCore = lora_engine.core  # type: ignore[assignment]
    admin, other = RawGateway(ctx, lora_engine.server.address), RawGateway(ctx, lora_engine.server.address)
    other.send(add("long", max_tokens=2000))
    assert isinstance(other.recv(), StepOutputs)
    core.read_gate.clear()  # the read blocks until the test lets it go
    admin.send(LoadAdapter("c1", "sql", "/adapters/sql"))
    time.sleep(0.05)
    steps_before = lora_engine.server.stats.num_steps
    time.sleep(0.2)
    assert lora_engine.server.stats.num_steps > steps_before + 10, "the loop stalled while the adapter was read"
    assert core.read_threads == ["lora-load_0"]
    assert admin.sock.poll(0) == 0  # no answer before the adapter serves
    core.read_gate.set()
    update = admin.recv()
    assert isinstance(update, ModelUpdate) and update.model.adapters == (AdapterInfo("sql", "fake"),)
    assert admin.recv() == AdapterReply("c1", load_id=1)
    assert _recv_not_steps(other) == update  # the other gateway's catalog follows too
    assert lora_engine.updates == [update.model]  # type: ignore[attr-defined]
    admin.send(LoadAdapter("c2", "sql", "/adapters/sql-v2"))  # a reload: a new load id
    assert isinstance(admin.recv(), ModelUpdate) and admin.recv() == AdapterReply("c2", load_id=2)


def test_a_bad_adapter_is_refused_with_the_reason_and_nothing_changes(lora_engine: Running,
                                                                      ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, lora_engine.server.address)
    gw.send(LoadAdapter("c1", "big", "bad"))
    reply = gw.recv()
    assert reply == AdapterReply("c1", "bad: layers.0.q_proj: rank 128 is over --max-lora-rank 64", REQUEST_REJECTED)
    gw.send(LoadAdapter("c2", "a=b", "/x"))  # refused before any read
    reply = gw.recv()
    assert isinstance(reply, AdapterReply) and reply.code == REQUEST_REJECTED and "contains '='" in reply.error
    assert lora_engine.updates == []  # type: ignore[attr-defined]


def test_unload_tells_everyone_and_an_unknown_name_is_not_found(lora_engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, lora_engine.server.address)
    gw.send(UnloadAdapter("c1", "sql"))
    assert gw.recv() == AdapterReply("c1", "the adapter 'sql' is not loaded", MODEL_NOT_FOUND)
    gw.send(LoadAdapter("c2", "sql", "/adapters/sql"))
    assert isinstance(gw.recv(), ModelUpdate) and isinstance(gw.recv(), AdapterReply)
    gw.send(UnloadAdapter("c3", "sql"))
    update = gw.recv()
    assert isinstance(update, ModelUpdate) and update.model.adapters == ()
    assert gw.recv() == AdapterReply("c3")


def test_an_engine_without_lora_refuses_admin_calls(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    gw.send(LoadAdapter("c1", "sql", "/adapters/sql"))
    assert gw.recv() == AdapterReply("c1", "LoRA is not enabled on this engine (--enable-lora)", REQUEST_REJECTED)
    gw.send(UnloadAdapter("c2", "sql"))
    assert gw.recv() == AdapterReply("c2", "the adapter 'sql' is not loaded", MODEL_NOT_FOUND)



def test_the_gateways_client_waits_for_the_reply_and_follows_the_model_update(lora_engine: Running) -> None:
    async def scenario() -> tuple[AdapterReply, tuple[AdapterInfo, ...], tuple[AdapterInfo, ...], AdapterReply]:
        admin, other = EngineClient(lora_engine.server.address), EngineClient(lora_engine.server.address)
        await admin.start()
        await other.start()
        try:
            reply = await admin.load_adapter("sql", "/adapters/sql")
            seen_by_admin = admin.model_info.adapters  # the update came before the reply
            await asyncio.sleep(0.1)
            gone = await other.unload_adapter("nope")
            return reply, seen_by_admin, other.model_info.adapters, gone
        finally:
            await admin.close()
            await other.close()

    reply, seen_by_admin, seen_by_other, gone = asyncio.run(scenario())
    assert (reply.error, reply.load_id) == ("", 1)
    assert seen_by_admin == seen_by_other == (AdapterInfo("sql", "fake"),)
    assert (gone.code, gone.error) == (MODEL_NOT_FOUND, "the adapter 'nope' is not loaded")


def test_the_loop_sleeps_while_its_only_work_waits_on_adapter_reads(lora_engine: Running, ctx: zmq.Context) -> None:
    """A request waiting for its evicted adapter's read leaves empty steps: the loop polls (woken by the read
    or a message, at most READ_WAIT_MS apart) rather than spinning on them, holding the GIL the reader needs."""
    core: LoraCore = lora_engine.core  # type: ignore[assignment]
    gw = RawGateway(ctx, lora_engine.server.address)
    gw.send(add("r", max_tokens=5000))
    assert isinstance(gw.recv(), StepOutputs)
    core.only_reads = True
    time.sleep(0.05)
    before = lora_engine.server.stats.num_steps
    time.sleep(0.3)
    assert lora_engine.server.stats.num_steps - before <= 0.3 / 0.02 + 3, "the loop spun on empty steps"
    core.only_reads = False
    time.sleep(0.05)
    before = lora_engine.server.stats.num_steps
    time.sleep(0.1)
    assert lora_engine.server.stats.num_steps - before > 30  # stepping at full pace again
