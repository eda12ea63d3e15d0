"""Which step failures cost only the step's requests, and which end the engine.

    runner: block moves ──► forward ──► sampling ──► scheduler.update (stop checks)
            EngineStateLost   └──────── RequestsFailed (those requests only) ────┘

A step's forward pass, sampling and stop checks read and write only the KV blocks
and the state of the requests scheduled in that step: when one of them raises,
failing exactly those requests (an Error reply each, their blocks freed) leaves
every other request as it was. Errors that leave the engine's state unknown stay
fatal: a failed block move (a swapped-out request's KV may be half copied), a
broken invariant (AssertionError), running out of host or device memory, a
device fault. Pure Python: no torch (a device error is recognised by its name and
message), no zmq.
"""

from __future__ import annotations


class EngineStateLost(RuntimeError):
    """A failure after which the KV pools or the scheduler's books cannot be trusted (fatal)."""


class RequestsFailed(Exception):
    """A step failed; its requests were aborted and their blocks freed. The engine goes on."""

    def __init__(self, request_ids: list[str], message: str) -> None:
        super().__init__(message)
        self.request_ids = request_ids
        """The client request ids that were in the failed step."""
        self.message = message


_FATAL_TYPES = (AssertionError, MemoryError, SystemError, EngineStateLost)
_DEVICE_MARKERS = ("OutOfMemory", "CUDA error", "device-side assert", "CUBLAS_STATUS", "HIP error")


def is_fatal(error: BaseException) -> bool:
    """True when the engine's state is unknown after `error` (the process must tell everyone and exit)."""
    if isinstance(error, _FATAL_TYPES) or not isinstance(error, Exception):
        return True
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _DEVICE_MARKERS)
