"""What the engine server is given: its settings (ServerConfig) and what it needs of the core (CoreLike).

Kept apart from the loop (engine/serving/server.py) so that callers building a server, and fakes
standing in for the core, read the contract without the loop. Plain Python: no zmq, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from engine.outputs import RequestDelta
from engine.request import Request
from engine.serving.step_stats import CoreCounts


class CoreLike(Protocol):
    """What the server needs from engine.core.EngineCore."""

    def add_request(self, request: Request) -> None: ...
    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        """Stop these requests now (their blocks are freed); the returned deltas are not needed here."""
        ...

    def step(self) -> list[RequestDelta]: ...
    def has_unfinished_requests(self) -> bool: ...
    def counts(self) -> CoreCounts: ...


MAX_MESSAGE_BYTES = 64 << 20
"""Largest frame a gateway may send (a 100k-token prompt is under 1 MiB)."""


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "tcp://127.0.0.1:5555"
    """ZeroMQ address to bind: tcp://HOST:PORT or ipc:///path."""
    shutdown_grace_s: float = 5.0
    """On SIGTERM, in-flight requests get this long to finish before they are aborted."""
    close_linger_ms: int = 2000
    """How long final messages (the shutdown Error) may take to flush at exit."""
    curve_dir: str | None = None
    """CURVE keys (shared/curve.py): only authorized gateways connect, traffic is encrypted; None: plain."""
    request_deadline_s: float | None = None
    """A request still in flight this long after the engine accepted it is aborted (its blocks freed)
    and its gateway told (Error code DEADLINE_EXCEEDED, the gateway settles it); None: no deadline."""
