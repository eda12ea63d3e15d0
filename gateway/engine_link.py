"""The gateway's lasting link to the engine: connect at start, reconnect after a loss.

`EngineClient` (protocol engineer) is one connection: once the engine dies it
stays dead, failing every open stream with `EngineDeadError` (-> 503). This
link owns replacing it: start-up waits for the engine's handshake (it may still
be loading the model), then a background task notices a dead client and keeps
trying a fresh one, so an engine restarted by systemd is picked up without
restarting the gateway. It knows nothing about HTTP or tokenizers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway.engine_client import EngineClient, EngineUnavailableError
from shared.curve import ClientKeys
from shared.protocol import Ready

log = logging.getLogger("pageserve.gateway")


class EngineLink:
    def __init__(self, address: str, retry_interval_s: float = 1.0, handshake_timeout_s: float = 5.0,
                 curve: ClientKeys | None = None) -> None:
        self.address = address
        self._curve = curve
        self._retry_interval_s = retry_interval_s
        self._handshake_timeout_s = handshake_timeout_s
        self._client: EngineClient | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def client(self) -> EngineClient | None:
        """The connected client, or None while the engine is unreachable."""
        return self._client if self._client is not None and self._client.healthy else None

    @property
    def model_info(self) -> Ready | None:
        client = self.client
        return client.model_info if client is not None else None

    async def start(self, timeout_s: float) -> None:
        """Connect once (retrying until `timeout_s`), then keep the link alive in the background."""
        deadline = time.monotonic() + timeout_s
        while not await self._connect():
            if time.monotonic() >= deadline:
                raise EngineUnavailableError(f"no engine answered at {self.address} within {timeout_s:g} s")
            await asyncio.sleep(self._retry_interval_s)
        self._task = asyncio.create_task(self._keep_alive())

    async def _connect(self) -> bool:
        client = EngineClient(self.address, handshake_timeout=self._handshake_timeout_s, curve=self._curve)
        try:
            await client.start()
        except EngineUnavailableError as e:
            # Expected while the engine loads its model at start-up; a lost engine was logged already.
            log.info("engine not available yet: %s", e)
            return False
        self._client = client
        return True

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._retry_interval_s)
            if self._client is not None and self._client.healthy:
                continue
            if self._client is not None:
                await self._client.close()
                self._client = None
                log.error("lost the engine at %s; reconnecting", self.address)
            if await self._connect():
                log.info("reconnected to the engine at %s", self.address)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()
            self._client = None
