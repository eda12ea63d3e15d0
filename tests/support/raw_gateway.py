"""A bare DEALER socket playing a gateway: every frame the engine sends is seen, nothing hidden.

Used by the engine server tests (fake core in a thread, real engine process) where
the frames themselves matter; tests about streams use gateway.engine_client instead.
"""

from __future__ import annotations

import zmq

from shared.protocol import PROTOCOL_VERSION, GetStats, Hello, Message, Stats, StepOutputs, decode, encode


class RawGateway:
    def __init__(self, ctx: zmq.Context, address: str, *, hello: bool = True, version: int = PROTOCOL_VERSION,
                 name: str = "test-gw", timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.pending: list[Message] = []
        self.ready: Message | None = None
        if hello:
            self.send(Hello(version, name))
            self.ready = self.recv()

    def send(self, msg: Message) -> None:
        self.sock.send(encode(msg))

    def recv(self, timeout_s: float | None = None) -> Message:
        if self.pending:
            return self.pending.pop(0)
        wait = self.timeout_s if timeout_s is None else timeout_s
        assert self.sock.poll(int(wait * 1000)), "no message from the engine"
        return decode(self.sock.recv())

    def recv_until_finished(self, request_ids: set[str]) -> list[StepOutputs]:
        """Every StepOutputs up to the one that finishes the last of `request_ids`."""
        msgs: list[StepOutputs] = []
        left = set(request_ids)
        while left:
            msg = self.recv()
            assert isinstance(msg, StepOutputs), msg
            msgs.append(msg)
            left -= {f.request_id for f in msg.finished}
        return msgs

    def stats(self) -> Stats:
        """The answer to GetStats; step outputs arriving meanwhile are kept for recv()."""
        self.send(GetStats())
        while True:
            assert self.sock.poll(int(self.timeout_s * 1000)), "no Stats from the engine"
            msg = decode(self.sock.recv())
            if isinstance(msg, Stats):
                return msg
            self.pending.append(msg)

    def close(self) -> None:
        self.sock.close(linger=0)
