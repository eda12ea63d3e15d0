"""The real `pageserve engine` process with the real EngineCore, over real ZeroMQ.

One engine process serves the module (loading a model costs seconds on 2 cores);
the last test stops it with SIGTERM. Raw DEALER sockets play
gateways where the frames themselves matter; EngineClient where streams do.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from gateway.engine_client import EngineClient, EngineDeadError, EngineUnavailableError
from shared.model_info import ModelInfo
from shared.protocol import (
    PROTOCOL_VERSION,
    Abort,
    AddRequest,
    Error,
    Finished,
    Hello,
    Stats,
    StepOutputs,
    TokenDelta,
    encode,
)
from shared.sampling import SamplingParams
from tests.support.raw_gateway import RawGateway
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow

NUM_BLOCKS = 48
BLOCK_SIZE = 16
STARTUP_TIMEOUT_S = 180.0


def engine_command(listen: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ops.cli", "engine", "--model", "smollm2", "--listen", listen,
            "--num-blocks", str(NUM_BLOCKS), "--block-size", str(BLOCK_SIZE), "--max-model-len", "512",
            "--max-num-seqs", "16", "--threads", "1", "--log-level", "INFO", *extra]


class EngineProcess:
    def __init__(self, listen: str, log_path: Path, *extra: str) -> None:
        self.address = listen
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(engine_command(listen, *extra), stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=Path(__file__).resolve().parents[3], env={**os.environ})
        self.ready = self._wait_ready()

    def _wait_ready(self) -> ModelInfo:
        async def handshake() -> ModelInfo | None:
            client = EngineClient(self.address, gateway_id="probe", handshake_timeout=2.0)
            try:
                await client.start()
            except EngineUnavailableError:
                return None
            info = client.model_info
            await client.close()
            return info

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log()}")
            info = asyncio.run(handshake())
            if info is not None:
                return info
        raise RuntimeError(f"engine not ready within {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    proc = EngineProcess(f"tcp://127.0.0.1:{free_port()}", tmp_path_factory.mktemp("engine") / "engine.log",
                         "--shutdown-grace", "0.5")
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture
def gateways(engine: EngineProcess) -> Iterator[list[RawGateway]]:
    ctx = zmq.Context()
    opened = [RawGateway(ctx, engine.address, name="raw", timeout_s=30.0) for _ in range(2)]
    yield opened
    for gw in opened:
        gw.close()
    ctx.term()


def greedy(rid: str, prompt: list[int], max_tokens: int) -> AddRequest:
    return AddRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))


def test_ready_describes_the_loaded_model(engine: EngineProcess) -> None:
    assert engine.ready.model_name == "smollm2"  # (the client took Ready only with our PROTOCOL_VERSION)
    assert (engine.ready.max_model_len, engine.ready.block_size) == (512, BLOCK_SIZE)
    assert engine.ready.eos_token_id == 2 and engine.ready.num_blocks == NUM_BLOCKS


def test_deltas_stream_every_step_and_usage_is_exact(gateways: list[RawGateway]) -> None:
    gw = gateways[0]
    gw.send(greedy("stream", [1, 504, 3458, 282, 4649, 30], max_tokens=6))
    msgs = gw.recv_until_finished({"stream"})
    deltas = [d for m in msgs for d in m.deltas]
    assert len(msgs) >= 6 and all(len(m.deltas) <= 1 for m in msgs)  # one step, one message, one token
    assert [d.num_output_tokens for d in deltas] == [1, 2, 3, 4, 5, 6]
    assert all(len(d.new_token_ids) == 1 and 0 <= d.new_token_ids[0] < 49152 for d in deltas)
    (fin,) = msgs[-1].finished
    assert (fin.reason, fin.usage.prompt_tokens, fin.usage.completion_tokens) == ("length", 6, 6)


def test_two_gateways_get_only_their_own_outputs(gateways: list[RawGateway]) -> None:
    a, b = gateways
    for i in range(3):
        a.send(greedy(f"a{i}", [1, 2, 3 + i], max_tokens=4))
        b.send(greedy(f"b{i}", [7, 8, 9 + i], max_tokens=5))
    got_a, got_b = a.recv_until_finished({"a0", "a1", "a2"}), b.recv_until_finished({"b0", "b1", "b2"})
    ids_a = {d.request_id for m in got_a for d in m.deltas}
    ids_b = {d.request_id for m in got_b for d in m.deltas}
    assert ids_a == {"a0", "a1", "a2"} and ids_b == {"b0", "b1", "b2"}
    assert sum(len(m.deltas) for m in got_a) == 12 and sum(len(m.deltas) for m in got_b) == 15
    assert any(len(m.deltas) > 1 for m in got_a)  # one message carried several requests of one step


def test_abort_returns_every_block_to_the_pool_within_a_second(gateways: list[RawGateway]) -> None:
    gw = gateways[0]
    gw.send(greedy("long", list(range(10, 10 + 100)), max_tokens=400))
    first = gw.recv()
    assert isinstance(first, StepOutputs) and first.deltas
    busy = gw.stats()
    assert busy.num_running == 1 and busy.num_free_blocks < NUM_BLOCKS
    gw.send(Abort(["long"]))
    t0 = time.monotonic()
    while True:
        msg = gw.recv()
        if isinstance(msg, StepOutputs) and msg.finished:
            break
    assert msg.finished[0].reason == "abort"
    while (stats := gw.stats()).num_free_blocks != NUM_BLOCKS:
        assert time.monotonic() - t0 < 1.0, stats
        time.sleep(0.02)
    assert stats.num_running == 0 and stats.num_aborted >= 1


def test_concurrent_requests_share_steps(engine: EngineProcess) -> None:
    async def main() -> Stats:
        client = EngineClient(engine.address)
        await client.start()

        async def one(i: int) -> list[TokenDelta | Finished]:
            async with await client.submit(greedy(f"c{i}", [1, 40 + i, 50], max_tokens=8)) as stream:
                return [item async for item in stream]

        results = await asyncio.gather(*(one(i) for i in range(8)))
        assert all(isinstance(r[-1], Finished) and r[-1].usage.completion_tokens == 8 for r in results)
        stats = await client.stats()
        await client.close()
        return stats

    stats = asyncio.run(main())
    assert stats.max_requests_per_step >= 4 and stats.num_free_blocks == NUM_BLOCKS


def test_n_samples_stream_under_one_request_id_and_finish_separately(engine: EngineProcess) -> None:
    async def main() -> list[TokenDelta | Finished]:
        client = EngineClient(engine.address)
        await client.start()
        request = AddRequest("three", [1, 30, 40], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5,
                                                                    ignore_eos=True))
        async with await client.submit(request) as stream:
            items = [item async for item in stream]
        await client.close()
        return items

    items = asyncio.run(main())
    finished = [i for i in items if isinstance(i, Finished)]
    assert sorted(f.index for f in finished) == [0, 1, 2]
    assert all(f.usage.completion_tokens == 5 and f.usage.prompt_tokens == 3 for f in finished)
    for index in range(3):
        assert sum(len(i.new_token_ids) for i in items if isinstance(i, TokenDelta) and i.index == index) == 5


def test_garbage_is_answered_and_the_engine_keeps_serving(gateways: list[RawGateway]) -> None:
    gw = gateways[0]
    for frame in (b"\x00\x01garbage", b"\x91\x63", encode(Hello(PROTOCOL_VERSION, "x"))[:-2], b"\x92\x03\x05"):
        gw.sock.send(frame)
        err = gw.recv()
        assert isinstance(err, Error) and err.kind == "request" and "malformed message" in err.message
    gw.send(greedy("oob", [1, 10**6], max_tokens=2))  # out-of-vocabulary ids never reach the model
    err = gw.recv()
    assert isinstance(err, Error) and err.request_id == "oob" and "[0, 49152)" in err.message
    gw.send(greedy("after", [1, 2], max_tokens=2))
    assert gw.recv_until_finished({"after"})[-1].finished[0].reason == "length"


EDGE_CASES = [
    AddRequest("top-k-beyond-vocab", [1, 2], SamplingParams(top_k=10**9, max_tokens=2)),
    AddRequest("seed-max", [1, 2], SamplingParams(seed=2**64 - 1, max_tokens=2)),
    AddRequest("seed-min", [1, 2], SamplingParams(seed=-(2**63), max_tokens=2)),
    # The context (512) caps it: at most 7 tokens after a 505-token prompt.
    AddRequest("max-tokens-huge", [5] * 505, SamplingParams(max_tokens=2**62, min_tokens=3, temperature=0.0)),
    # Masked while min_tokens holds: an index past the logits (this ended the engine once).
    AddRequest("stop-ids-out-of-vocab", [1, 2], SamplingParams(stop_token_ids=(10**9,), min_tokens=1, max_tokens=2)),
    AddRequest("n-16", [1, 2], SamplingParams(n=16, max_tokens=2, top_p=0.01)),
    AddRequest("priorities", [1, 2], SamplingParams(max_tokens=2), priority=-(2**62), weight=1e-300),
    AddRequest("unicode", [1, 2], SamplingParams(max_tokens=2), tenant_id="tënant-ø" * 50, cache_salt="🧂" * 100),
    AddRequest("fills-the-context", [5] * 511, SamplingParams(max_tokens=50, ignore_eos=True)),
    AddRequest("weight-inf", [1, 2], SamplingParams(max_tokens=2), weight=float("inf")),
]


def test_edge_case_requests_end_cleanly_and_the_engine_survives(gateways: list[RawGateway]) -> None:
    gw = gateways[0]
    for request in EDGE_CASES:
        gw.send(request)
    outcome: dict[str, str] = {}
    while len(outcome) < len(EDGE_CASES):
        msg = gw.recv(timeout_s=120)
        if isinstance(msg, Error):
            assert msg.kind == "request" and msg.request_id is not None, msg
            outcome[msg.request_id] = "error"
        elif isinstance(msg, StepOutputs):
            for fin in msg.finished:
                outcome[fin.request_id] = "finished"
    assert outcome["weight-inf"] == outcome["stop-ids-out-of-vocab"] == "error"
    assert outcome["top-k-beyond-vocab"] == outcome["n-16"] == outcome["fills-the-context"] == "finished"
    assert outcome["max-tokens-huge"] == "finished"
    gw.send(greedy("still-serving", [1, 2], max_tokens=2))
    assert gw.recv_until_finished({"still-serving"})[-1].finished[0].reason == "length"
    stats = gw.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == NUM_BLOCKS


def test_a_killed_engine_fails_open_streams_at_once(tmp_path: Path) -> None:
    """SIGKILL: no goodbye from the engine; the client's connection monitor notices the closed socket."""
    proc = EngineProcess(f"ipc://{tmp_path}/engine.sock", tmp_path / "engine.log")

    async def main() -> tuple[str, float, bool]:
        client = EngineClient(proc.address)
        await client.start()
        stream = await client.submit(greedy("doomed", [1, 2, 3], max_tokens=500))
        await stream.__anext__()
        proc.proc.kill()
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError) as e:
            async for _ in stream:
                pass
        waited = time.monotonic() - t0
        healthy = client.healthy
        await client.close()
        return str(e.value), waited, healthy

    try:
        message, waited, healthy = asyncio.run(main())
    finally:
        proc.stop()
    assert "lost the connection to the engine" in message and not healthy
    assert waited < 2.0


def test_sigterm_while_the_model_loads_exits_0_at_once(tmp_path: Path) -> None:
    log_path = tmp_path / "engine.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(engine_command(f"tcp://127.0.0.1:{free_port()}"), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while "loading model" not in log_path.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert "stopped by signal 15 while starting" in log_path.read_text()


def test_sigterm_tells_in_flight_requests_and_exits_0(engine: EngineProcess) -> None:
    """Runs last (file order): it stops the module's engine, which a second model load would cost."""

    async def main() -> str:
        client = EngineClient(engine.address)
        await client.start()
        stream = await client.submit(greedy("inflight", [1, 2, 3], max_tokens=500))
        await stream.__anext__()
        engine.proc.send_signal(signal.SIGTERM)
        with pytest.raises(EngineDeadError) as e:
            async for _ in stream:
                pass
        await client.close()
        return str(e.value)

    message = asyncio.run(main())
    assert "shutting down" in message and "1 in-flight request(s) aborted" in message
    assert engine.proc.wait(30) == 0
    assert "shutdown: aborted 1 in-flight requests after the grace period" in engine.log()
