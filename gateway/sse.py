"""Server-sent events: the `data: ...\\n\\n` framing and a response that notices a client leaving.

Owns the wire framing of a stream and its lifetime. `SSEResponse` sends events
from an async iterator while a second task listens for `http.disconnect`; when
the client goes away the sending task is cancelled, and `on_close` always runs
exactly once (shielded from that cancellation) whether the stream ended
normally, failed, was cut, or never started. That callback is where the
caller aborts the engine request and settles usage. It knows nothing about
OpenAI's chunk shapes or the engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying a JSON object (compact, UTF-8, no ASCII escaping)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class SSEResponse:
    """An ASGI response streaming `events` as text/event-stream."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        status_code: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._events = events
        self._on_close = on_close
        self._status_code = status_code
        self._headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",  # proxies must not buffer a token stream
            **(headers or {}),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream_then_stop() -> None:
                    await self._stream(send)
                    tg.cancel_scope.cancel()

                async def wait_disconnect_then_stop() -> None:
                    await _wait_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream_then_stop)
                tg.start_soon(wait_disconnect_then_stop)
        except* OSError:
            pass  # the socket broke under a send (ASGI 2.4 servers raise): the same as a disconnect
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await _aclose(self._events)
                finally:
                    await self._on_close()

    async def _stream(self, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self._headers.items()]
        await send({"type": "http.response.start", "status": self._status_code, "headers": headers})
        async for event in self._events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _aclose(events: AsyncIterator[bytes]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
