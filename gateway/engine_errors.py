"""What the gateway's engine client raises about the engine: one base class, three kinds.

    EngineUnavailableError  no handshake (no answer in time, or a version mismatch)
    EngineDeadError         the engine is gone: every open stream gets it (a 503)
    RequestFailedError      the engine refused or failed one request; the engine goes on

Plain exceptions: no zmq, no asyncio, so any gateway module may catch them without the client.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of everything this client raises about the engine."""


class EngineUnavailableError(EngineError):
    """start() could not complete the handshake (no answer in time, or a version mismatch)."""


class EngineDeadError(EngineError):
    """The engine is gone (exited, connection lost, fatal error, or this client closed)."""


class RequestFailedError(EngineError):
    """The engine refused or failed this one request; the engine itself goes on."""

    def __init__(self, message: str, code: str = "", param: str = "") -> None:
        super().__init__(message)
        self.code = code
        """shared.protocol.REQUEST_REJECTED (refused at admission: the caller's fault) or REQUEST_FAILED."""
        self.param = param
