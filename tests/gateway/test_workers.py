"""`pageserve gateway --workers 2`: two processes share the port, each its own engine client.

Real gateway processes and the real `EngineServer` loop around the protocol
tests' fake core (no model); the engine's Stats count the connected gateways.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time

import httpx

from engine.serving.server import EngineServer, ServerConfig
from gateway.engine_client import EngineClient
from ops.launcher import create_demo_key
from shared.model_info import ModelInfo
from tests.engine.serving.fake_core import FakeCore
from tests.support.redis_server import free_port


async def engine_gateways(address: str) -> int:
    client = EngineClient(address)
    await client.start()
    try:
        return (await client.stats()).num_gateways - 1  # not counting this client
    finally:
        await client.close()


def test_two_workers_each_connect_to_the_engine(redis_url: str) -> None:
    info = ModelInfo("smollm2", max_model_len=128, block_size=16, eos_token_id=2, num_blocks=64, vocab_size=49152)
    engine = EngineServer(FakeCore(info=info), info, ServerConfig(listen=f"tcp://127.0.0.1:{free_port()}",
                                                        shutdown_grace_s=0.1, close_linger_ms=100))
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    key = asyncio.run(create_demo_key(redis_url, "wk", "workers"))
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "ops.cli", "gateway", "--engine", engine.address,
                                "--redis-url", redis_url, "--redis-prefix", "wk", "--port", str(port),
                                "--workers", "2", "--log-level", "warning"])
    try:
        deadline = time.monotonic() + 60
        while asyncio.run(engine_gateways(engine.address)) < 2:
            assert time.monotonic() < deadline and gateway.poll() is None, "workers did not connect"
            time.sleep(0.2)
        body = {"model": "smollm2", "prompt": [1, 504], "max_tokens": 3}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(6):  # new connections are spread over the workers by the kernel
                r = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}",
                                                                      "Connection": "close"})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)
        engine.request_stop()
        thread.join(5)
