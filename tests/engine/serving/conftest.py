"""Fixtures of the engine loop tests: a running loop with a fake core, and a zmq context that closes its sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from tests.engine.serving.fake_core import Running, serving


@pytest.fixture
def engine() -> Iterator[Running]:
    with serving() as running:
        yield running


class Sockets(zmq.Context):
    """A context whose sockets are all closed at teardown (an unclosed one would hang term())."""

    opened: list[zmq.Socket]

    def __init__(self) -> None:
        super().__init__()
        self.opened = []

    def socket(self, socket_type: int, **kwargs: object) -> zmq.Socket:  # type: ignore[override]
        sock = super().socket(socket_type, **kwargs)
        self.opened.append(sock)
        return sock


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = Sockets()
    yield context
    for sock in context.opened:
        sock.close(linger=0)
    context.term()
