"""The engine socket with CURVE (shared/curve.py): an authorized gateway is served; a client without
the keys, or with keys the engine never authorized, gets nothing at all."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import zmq

from engine.serving.server import EngineServer, ServerConfig
from gateway.engine_client import EngineClient
from shared.curve import client_keys, connect_curve, generate
from shared.protocol import PROTOCOL_VERSION, AddRequest, Finished, Hello, encode
from shared.sampling import SamplingParams
from tests.engine.serving.fake_core import INFO, FakeCore


def _serve(keys: Path) -> EngineServer:
    server = EngineServer(FakeCore(), INFO, ServerConfig(listen="tcp://127.0.0.1:*", close_linger_ms=100,
                                                         curve_dir=str(keys)))
    threading.Thread(target=server.serve, daemon=True).start()
    return server


def _silent(address: str, setup: object = None) -> bool:
    """True when a DEALER saying Hello hears nothing back within a second."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if setup is not None:
        setup(sock)  # type: ignore[operator]
    sock.connect(address)
    sock.send(encode(Hello(PROTOCOL_VERSION, "intruder")))
    heard = sock.poll(1000)
    sock.close()
    ctx.term()
    return not heard


def test_only_authorized_gateways_get_anything(tmp_path: Path) -> None:
    generate(tmp_path / "keys")
    generate(tmp_path / "other")  # a second set: a valid key pair the engine never authorized
    server = _serve(tmp_path / "keys")
    try:
        assert _silent(server.address)  # plain text: no handshake at all
        stranger = client_keys(tmp_path / "other")
        impostor = client_keys(tmp_path / "keys").__class__(stranger.public, stranger.secret,
                                                             client_keys(tmp_path / "keys").server_public)
        assert _silent(server.address, lambda s: connect_curve(s, impostor))

        async def served() -> list[object]:
            client = EngineClient(server.address, handshake_timeout=5, curve=client_keys(tmp_path / "keys"))
            await client.start()
            try:
                stream = await client.submit(AddRequest("r", [1, 2], SamplingParams(max_tokens=2)))
                return [item async for item in stream]
            finally:
                await client.close()

        items = asyncio.run(served())
        assert isinstance(items[-1], Finished) and items[-1].reason == "length"
    finally:
        server.request_stop()
