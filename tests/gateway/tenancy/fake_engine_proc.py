"""An engine process without a model: the real EngineServer loop around tests/engine's FakeCore.

    python -m tests.gateway.tenancy.fake_engine_proc tcp://127.0.0.1:PORT

Real ZeroMQ, real protocol, one token per request per step: enough for real
gateway processes to serve real HTTP in the multi-gateway quota tests.
"""

from __future__ import annotations

import signal
import sys

from engine.serving.server import EngineServer, ServerConfig
from shared.model_info import ModelInfo
from tests.engine.serving.fake_core import FakeCore


def main(listen: str) -> int:
    info = ModelInfo("smollm2", max_model_len=2048, block_size=16, eos_token_id=2, num_blocks=4096,
                      vocab_size=49152)
    server = EngineServer(FakeCore(num_blocks=4096, block_size=16, info=info), info,
                          ServerConfig(listen=listen, shutdown_grace_s=0.2, close_linger_ms=200))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    return server.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
