"""`pageserve engine --tensor-parallel-size 2` as a real process: it serves concurrent requests, and
SIGTERM stops rank 0 and its worker and leaves its temp directory (a private TMPDIR) as it found it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.engine_client import EngineClient
from shared.protocol import Finished, TokenDelta
from tests.engine.serving.test_server import EngineProcess, greedy
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow


def _workers(pid: int) -> list[int]:
    """The engine's children that run the tensor-parallel worker module."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    return [c for c in children if b"engine.worker.parallel.worker" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_a_split_engine_serves_and_stops_with_its_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))  # the engine's (and its worker's) temp directory
    engine = EngineProcess(f"tcp://127.0.0.1:{free_port()}", tmp_path / "engine.log", "--tensor-parallel-size", "2",
                           "--dtype", "float32")
    workers = _workers(engine.proc.pid)

    async def main() -> list[list[TokenDelta | Finished]]:
        client = EngineClient(engine.address)
        await client.start()

        async def one(i: int) -> list[TokenDelta | Finished]:
            async with await client.submit(greedy(f"tp{i}", [1, 40 + i, 50], max_tokens=6)) as stream:
                return [item async for item in stream]

        results = await asyncio.gather(*(one(i) for i in range(4)))
        await client.close()
        return results

    try:
        assert len(workers) == 1, engine.log()
        assert [p.name.startswith("pageserve-tp-") for p in private_tmp.iterdir()] == [True]  # the rendezvous
        results = asyncio.run(main())
        assert all(isinstance(r[-1], Finished) and r[-1].usage.completion_tokens == 6 for r in results), results
    finally:
        assert engine.stop() == 0, engine.log()
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in workers), engine.log()
    assert list(private_tmp.iterdir()) == [], engine.log()
