"""The engine server's loop with a fake core, in a thread: how it stops, and what leaving gateways and
deadlines abort (stop with a grace period, a second stop, a fatal core error, Bye, a vanished gateway).

Raw DEALER sockets play the gateways, so every frame the engine sends is seen.
Routing, aborts and bad input: test_server_loop.py; signals: test_server_signals.py.
"""

from __future__ import annotations

import time

import zmq

from shared.protocol import DEADLINE_EXCEEDED, SHUTTING_DOWN, Bye, Error, GetStats, Stats
from tests.engine.serving.fake_core import Running, add, start_server
from tests.support.raw_gateway import RawGateway


def _stopping_with(ctx: zmq.Context, grace_s: float, rid: str, max_tokens: int) -> tuple[Running, RawGateway]:
    """A loop with one request in flight (its first output seen) that has just been asked to stop."""
    running = start_server(grace_s=grace_s)
    gw = RawGateway(ctx, running.server.address)
    gw.send(add(rid, max_tokens=max_tokens))
    gw.recv()
    running.server.request_stop()
    return running, gw


def test_stop_with_requests_in_flight_aborts_them_and_tells_every_gateway(ctx: zmq.Context) -> None:
    running = start_server(grace_s=0.3)
    gw1, gw2 = RawGateway(ctx, running.server.address), RawGateway(ctx, running.server.address)
    gw1.send(add("slow", max_tokens=9000))
    gw1.recv()
    t0 = time.monotonic()
    running.server.request_stop()
    gw2.send(add("late"))
    late = gw2.recv()
    assert isinstance(late, Error) and late.request_id == "late" and "shutting down" in late.message
    assert late.code == SHUTTING_DOWN
    running.thread.join(5.0)
    assert running.exit_code == [0] and time.monotonic() - t0 < 2.0
    assert running.core.aborted == ["slow"]
    for gw in (gw1, gw2):
        while not isinstance(msg := gw.recv(), Error):
            pass
        assert msg.kind == "engine" and "shutting down" in msg.message and "1 in-flight" in msg.message


def test_stop_lets_short_requests_finish_within_the_grace_period(ctx: zmq.Context) -> None:
    running, gw = _stopping_with(ctx, 5.0, "short", max_tokens=5)
    msgs = gw.recv_until_finished({"short"})
    assert msgs[-1].finished[0].reason == "length"
    running.thread.join(5.0)
    assert running.exit_code == [0] and running.core.aborted == []


def test_a_fatal_core_error_is_told_to_every_gateway_and_exits_1(ctx: zmq.Context) -> None:
    running = start_server()
    gws = [RawGateway(ctx, running.server.address) for _ in range(2)]
    running.core.fail_next_step = RuntimeError("CUDA fell over")
    gws[0].send(add("boom"))
    for gw in gws:
        err = gw.recv()
        assert isinstance(err, Error) and err.kind == "engine"
        assert err.message == "engine failed: RuntimeError: CUDA fell over"
    running.thread.join(5.0)
    assert running.exit_code == [1]
    running.server.request_stop()  # a late SIGTERM after the loop ended (its wake pipe closed): a no-op


def test_a_request_past_its_deadline_is_aborted_and_its_gateway_told(ctx: zmq.Context) -> None:
    running = start_server(deadline_s=0.3)
    try:
        gw = RawGateway(ctx, running.server.address)
        gw.send(add("slow", max_tokens=9000))
        gw.send(add("quick", max_tokens=2))
        started = time.monotonic()
        seen: dict[str, object] = {}
        while "slow" not in seen:
            msg = gw.recv()
            if isinstance(msg, Error):
                seen[msg.request_id or ""] = msg
            else:
                seen.update({f.request_id: f for f in msg.finished})  # type: ignore[union-attr]
        err = seen["slow"]
        assert isinstance(err, Error) and (err.kind, err.code) == ("request", DEADLINE_EXCEEDED)
        assert 0.3 <= time.monotonic() - started < 2.0 and "quick" in seen
        assert running.core.aborted == ["slow"] and gw.stats().num_running == 0
    finally:
        running.stop()


def test_requests_of_a_vanished_gateway_are_aborted(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    gw.send(add("orphan", max_tokens=9000))
    gw.recv()
    gw.sock.close(linger=0)
    deadline = time.monotonic() + 5
    while engine.core.aborted != ["orphan"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.core.aborted == ["orphan"]


def test_bye_aborts_the_gateways_requests_and_forgets_it(engine: Running, ctx: zmq.Context) -> None:
    leaving, staying = RawGateway(ctx, engine.server.address), RawGateway(ctx, engine.server.address)
    leaving.send(add("left-behind", max_tokens=9000))
    leaving.recv()
    leaving.send(Bye("shutting down the gateway"))
    deadline = time.monotonic() + 5
    while engine.core.aborted != ["left-behind"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.core.aborted == ["left-behind"]
    staying.send(GetStats())
    stats = staying.recv()
    assert isinstance(stats, Stats) and stats.num_gateways == 1 and stats.num_aborted == 1


def test_a_second_stop_request_skips_the_rest_of_the_grace_period(ctx: zmq.Context) -> None:
    running, _ = _stopping_with(ctx, 60.0, "slow", max_tokens=9000)
    time.sleep(0.1)
    assert running.thread.is_alive()  # still inside its 60 s of grace
    running.server.request_stop()  # Ctrl-C twice
    running.thread.join(5.0)
    assert running.exit_code == [0] and running.core.aborted == ["slow"]
