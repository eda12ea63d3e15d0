"""Admin calls on LoRA adapters (issue 43): reads off the step loop, registry swaps on it.

    LoadAdapter ──> (loop) reserve a new load id ──> (worker thread) read + check the folder
                                                          │ done: wakes the loop
    (loop, next turn) install: the name now means this load ─┴─> ModelUpdate to every gateway, AdapterReply
    UnloadAdapter ──> (loop) retire the name at once ──────────> ModelUpdate, AdapterReply

Reading safetensors and laying tensors out takes tens of milliseconds per 50 MB: on the loop it would
stall every running stream for that long, so it runs on the core's one reader thread
(engine/worker/lora/reader.py, which also re-reads evicted adapters; loads complete in the order
they were asked). The registry is touched only on the loop, so no request ever sees a
half-installed adapter. A bad adapter (rank over the limit, unknown target, shapes that do not fit,
a missing file) is an AdapterReply with the LoraError's words and REQUEST_REJECTED; an unknown name
to unload, MODEL_NOT_FOUND; the reader failing otherwise, REQUEST_FAILED (the engine goes on). A core without LoRA support refuses every call the same way.
It knows nothing about sockets: the server sends what `load`, `unload` and `completed` return.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.worker.lora.errors import LoraError, LoraNotFound
from engine.worker.lora.reader import LoraReader
from shared.protocol import (
    MODEL_NOT_FOUND,
    REQUEST_FAILED,
    REQUEST_REJECTED,
    AdapterReply,
    LoadAdapter,
    UnloadAdapter,
)

log = logging.getLogger("pageserve.engine")


class LoraCore(Protocol):
    """What the calls need of engine.core.EngineCore."""

    lora_reader: LoraReader
    def reserve_lora(self, name: str) -> int: ...
    def read_lora(self, path: str, name: str, load_id: int) -> Any: ...
    def install_lora(self, name: str, path: str, adapter: Any, seconds: float) -> None: ...
    def unload_lora(self, name: str) -> None: ...


@dataclass(frozen=True)
class Pending:
    gateway: bytes
    call: LoadAdapter
    load_id: int
    future: concurrent.futures.Future[tuple[Any, float]]


def _refusal(call_id: str, error: Exception) -> AdapterReply:
    code = MODEL_NOT_FOUND if isinstance(error, LoraNotFound) else REQUEST_REJECTED
    return AdapterReply(call_id, str(error) or type(error).__name__, code)


class LoraCalls:
    def __init__(self, core: object, wake: Callable[[], None]) -> None:
        """`wake`: makes the loop's poll return (a finished read must not wait for the next message)."""
        self._core: LoraCore | None = core if hasattr(core, "reserve_lora") else None  # type: ignore[assignment]
        if self._core is not None:
            self._core.lora_reader.wake = wake  # every read the core's reader finishes wakes the loop
        self._pending: list[Pending] = []

    def load(self, gateway: bytes, call: LoadAdapter) -> AdapterReply | None:
        """Start reading; None while it runs (`completed` answers it), or the refusal now."""
        try:
            if self._core is None:
                raise LoraError("LoRA is not enabled on this engine (--enable-lora)")
            load_id = self._core.reserve_lora(call.lora_name)
        except LoraError as e:
            return _refusal(call.call_id, e)
        core = self._core
        future = core.lora_reader.submit(lambda: core.read_lora(call.lora_path, call.lora_name, load_id))
        self._pending.append(Pending(gateway, call, load_id, future))
        return None

    def unload(self, call: UnloadAdapter) -> tuple[AdapterReply, bool]:
        """The reply, and whether the adapters changed."""
        try:
            if self._core is None:
                raise LoraNotFound(f"the adapter {call.lora_name!r} is not loaded")
            self._core.unload_lora(call.lora_name)
        except LoraError as e:
            return _refusal(call.call_id, e), False
        log.info("unloaded LoRA adapter %s", call.lora_name)
        return AdapterReply(call.call_id), True

    def completed(self) -> list[tuple[bytes, AdapterReply, bool]]:
        """Finished reads, in the order they were asked, installed: (gateway, reply, adapters changed)."""
        done: list[tuple[bytes, AdapterReply, bool]] = []
        while self._pending and self._pending[0].future.done():
            p = self._pending.pop(0)
            done.append((p.gateway, *self._install(p)))
        return done

    def _install(self, p: Pending) -> tuple[AdapterReply, bool]:
        assert self._core is not None
        try:
            adapter, seconds = p.future.result()
        except LoraError as e:
            log.warning("LoRA adapter %s not loaded: %s", p.call.lora_name, e)
            return _refusal(p.call.call_id, e), False
        except Exception as e:  # the reader's own failure (out of memory, a torch error): this call only
            log.exception("reading LoRA adapter %s failed", p.call.lora_name)
            return AdapterReply(p.call.call_id, f"reading the adapter failed: {type(e).__name__}: {e}",
                                REQUEST_FAILED), False
        self._core.install_lora(p.call.lora_name, p.call.lora_path, adapter, seconds)
        log.info("loaded LoRA adapter %s (load %d) in %.3f s", p.call.lora_name, p.load_id, seconds)
        return AdapterReply(p.call.call_id, load_id=p.load_id), True

    def close(self) -> None:
        if self._core is not None:
            self._core.lora_reader.close()
