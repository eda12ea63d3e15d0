"""A stand-in for EngineCore in fast loop tests: one token per running request per step.

It implements exactly the methods engine.serving.server.CoreLike names, with the same
meaning (deltas carry cumulative counts; "length" at max_tokens), so the
server's routing, aborts and shutdown are tested without loading a model.
The tests in tests/engine/serving/test_server.py run the same paths with the real core.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from engine.outputs import RequestDelta
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.request_checks import validate_request
from engine.serving.server import EngineServer, ServerConfig
from engine.serving.synthetic_core import SyntheticCore
from engine.step_failures import RequestsFailed
from engine.worker.lora.errors import LoraNotFound
from shared.model_info import ModelInfo
from shared.protocol import AddRequest
from shared.sampling import SamplingParams


class FakeCore(SyntheticCore):
    """SyntheticCore (tokens 100, 101, ...) plus what tests steer: the real core's admission checks,
    a step gate, an injected failure, the aborted ids, and a refusal of huge max_tokens."""

    def __init__(self, num_blocks: int = 64, block_size: int = 4, info: ModelInfo | None = None) -> None:
        super().__init__(range(100, 10_100), num_blocks, block_size)
        self.info = info or INFO
        """The model facts requests are checked against (the real core's admission checks)."""
        self.aborted: list[str] = []
        self.fail_next_step: Exception | None = None
        self.step_gate = threading.Event()
        """Steps run only while this is set: tests hold requests in flight by clearing it."""
        self.step_gate.set()
        self.entered_step = threading.Event()
        """Set each time a step starts (before it waits on step_gate)."""

    def add_request(self, request: Request) -> None:
        # The real core's admission checks, against the model facts it serves.
        config = SchedulerConfig(max_model_len=self.info.max_model_len)
        validate_request(request, config, lambda n: -(-n // self.block_size), 10**6, self.info.vocab_size)
        if request.sampling.max_tokens > 10_000:
            raise ValueError("max_tokens too large for the fake core")
        if request.lora_name:  # the real core without that adapter (engine/core.py)
            raise LoraNotFound(f"the model {request.lora_name!r} does not exist")
        super().add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        out = super().abort_requests(request_ids)
        self.aborted += [d.request_id for d in out]
        return out

    def step(self) -> list[RequestDelta]:
        self.entered_step.set()
        self.step_gate.wait(5.0)
        time.sleep(0.001)  # a step takes time: tests can act while a request is in flight
        if isinstance(self.fail_next_step, RequestsFailed):  # like the real core: those requests are gone
            failure, self.fail_next_step = self.fail_next_step, None
            for rid in failure.request_ids:
                self.requests.pop(rid, None)
            raise failure
        if self.fail_next_step is not None:
            raise self.fail_next_step
        return super().step()


INFO = ModelInfo("fake", max_model_len=64, block_size=4, eos_token_id=2, num_blocks=64, vocab_size=1000)


@dataclass
class Running:
    server: EngineServer
    core: FakeCore
    thread: threading.Thread
    exit_code: list[int]

    def stop(self, timeout: float = 5.0) -> int:
        self.server.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the engine loop did not stop"
        return self.exit_code[0]


def start_server(grace_s: float = 0.2, listen: str = "tcp://127.0.0.1:*", deadline_s: float | None = None) -> Running:
    core = FakeCore()
    server = EngineServer(core, INFO, ServerConfig(listen=listen, shutdown_grace_s=grace_s,
                                                   close_linger_ms=500, request_deadline_s=deadline_s))
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(server.serve()), daemon=True)
    thread.start()
    return Running(server, core, thread, exit_code)


@contextlib.contextmanager
def serving() -> Iterator[Running]:
    """A running loop for one test; stopped afterwards unless the test ended it (its step gate reopened first)."""
    running = start_server()
    try:
        yield running
    finally:
        if running.thread.is_alive():
            running.core.step_gate.set()
            running.stop()


def add(rid: str, max_tokens: int = 4, prompt: list[int] | None = None, n: int = 1) -> AddRequest:
    """A request for the fake core (its prompt [5, 6, 7] unless given)."""
    return AddRequest(rid, [5, 6, 7] if prompt is None else prompt, SamplingParams(max_tokens=max_tokens, n=n))
