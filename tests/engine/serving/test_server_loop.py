"""The engine server's loop with a fake core, in a thread: routing, aborts, garbage, failed steps.

Raw DEALER sockets play the gateways, so every frame the engine sends is seen.
How it stops: test_server_shutdown.py. The same behaviour with the real EngineCore in a real process: test_server.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import zmq

from engine.step_failures import RequestsFailed
from shared.model_info import ModelInfo
from shared.protocol import (
    MODEL_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_FAILED,
    Abort,
    AddRequest,
    Error,
    GetStats,
    Hello,
    Ready,
    Stats,
    StepOutputs,
    encode,
)
from shared.sampling import SamplingParams
from tests.engine.serving.fake_core import Running, add, start_server
from tests.support.raw_gateway import RawGateway


def test_hello_gets_ready_with_the_model_facts(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    assert gw.ready == Ready(PROTOCOL_VERSION, ModelInfo("fake", 64, 4, 2, 64, 1000))


def test_version_mismatch_is_refused_naming_both_versions(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address, hello=False)
    gw.send(Hello(PROTOCOL_VERSION + 1, "future-gw"))
    reply = gw.recv()
    assert isinstance(reply, Error) and reply.kind == "engine"
    assert f"engine speaks version {PROTOCOL_VERSION}" in reply.message
    assert f"'future-gw' speaks version {PROTOCOL_VERSION + 1}" in reply.message
    gw.send(add("r"))  # a refused gateway is not admitted
    assert "send Hello" in gw.recv().message  # type: ignore[union-attr]


def test_deltas_stream_one_message_per_step_then_finished_with_usage(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    gw.send(add("a", max_tokens=3))
    msgs = gw.recv_until_finished({"a"})
    assert [[d.new_token_ids for d in m.deltas] for m in msgs] == [[[100]], [[101]], [[102]]]
    assert [d.num_output_tokens for m in msgs for d in m.deltas] == [1, 2, 3]
    assert len({m.step for m in msgs}) == 3
    (fin,) = msgs[-1].finished
    assert (fin.reason, fin.usage.prompt_tokens, fin.usage.completion_tokens) == ("length", 3, 3)


def test_one_step_batches_all_of_a_gateways_requests_into_one_message(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    engine.core.step_gate.clear()  # hold the loop so that both requests join the same steps
    gw.send(add("a", max_tokens=2))
    gw.send(add("b", max_tokens=2))
    time.sleep(0.1)
    engine.core.step_gate.set()
    msgs = gw.recv_until_finished({"a", "b"})
    per_step = [sorted(d.request_id for d in m.deltas) for m in msgs]
    assert ["a", "b"] in per_step  # a step that ran both sent them together


def test_finished_carries_the_time_from_arrival_to_the_first_step(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    engine.core.step_gate.clear()  # the first step waits: the request is queued meanwhile
    gw.send(add("held", max_tokens=2))
    assert engine.core.entered_step.wait(5.0)
    time.sleep(0.2)
    engine.core.step_gate.set()
    (fin,) = [f for m in gw.recv_until_finished({"held"}) for f in m.finished]
    assert fin.queue_seconds is not None and 0.2 <= fin.queue_seconds < 5.0


def test_two_gateways_outputs_are_not_mixed(engine: Running, ctx: zmq.Context) -> None:
    gw1, gw2 = RawGateway(ctx, engine.server.address), RawGateway(ctx, engine.server.address)
    for i in range(3):
        gw1.send(add(f"one-{i}", max_tokens=5))
        gw2.send(add(f"two-{i}", max_tokens=4))
    msgs1 = gw1.recv_until_finished({f"one-{i}" for i in range(3)})
    msgs2 = gw2.recv_until_finished({f"two-{i}" for i in range(3)})
    ids1 = {d.request_id for m in msgs1 for d in m.deltas} | {f.request_id for m in msgs1 for f in m.finished}
    ids2 = {d.request_id for m in msgs2 for d in m.deltas} | {f.request_id for m in msgs2 for f in m.finished}
    assert ids1 == {"one-0", "one-1", "one-2"} and ids2 == {"two-0", "two-1", "two-2"}
    assert sum(len(m.deltas) for m in msgs1) == 15 and sum(len(m.deltas) for m in msgs2) == 12


def test_abort_takes_effect_before_the_next_step_and_reports_usage(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    engine.core.step_gate.clear()
    gw.send(add("long", max_tokens=1000))
    assert engine.core.entered_step.wait(5.0)  # the loop is inside a step with "long" in it
    gw.send(Abort(["long", "unknown-id"]))
    time.sleep(0.05)
    engine.core.step_gate.set()
    first, second = gw.recv(), gw.recv()
    assert isinstance(first, StepOutputs) and [d.num_output_tokens for d in first.deltas] == [1]
    assert isinstance(second, StepOutputs) and second.deltas == []  # no second step ran for it
    (fin,) = second.finished
    assert (fin.request_id, fin.reason, fin.usage.prompt_tokens, fin.usage.completion_tokens) == ("long", "abort", 3, 1)
    assert engine.core.aborted == ["long"]
    gw.send(GetStats())
    stats = gw.recv()
    assert isinstance(stats, Stats) and stats.num_aborted == 1 and stats.num_free_blocks == 64
    assert stats.num_steps == 1
    assert stats.loop_seconds >= stats.step_seconds >= 0.001  # the fake step sleeps 1 ms


def test_a_gateway_cannot_abort_another_gateways_request(engine: Running, ctx: zmq.Context) -> None:
    owner, other = RawGateway(ctx, engine.server.address), RawGateway(ctx, engine.server.address)
    owner.send(add("mine", max_tokens=20))
    first = owner.recv()
    other.send(Abort(["mine"]))
    msgs = [first, *owner.recv_until_finished({"mine"})]
    assert msgs[-1].finished[0].reason == "length"  # type: ignore[union-attr]
    assert engine.core.aborted == []


def test_n_samples_finish_separately(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    gw.send(add("multi", max_tokens=5000, n=3))
    gw.recv()
    gw.send(Abort(["multi"]))
    msgs = gw.recv_until_finished({"multi"})
    assert sorted(f.index for f in msgs[-1].finished) == [0, 1, 2]


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (add("empty", prompt=[]), "the prompt is empty"),
        (add("long", prompt=[1] * 64), "the prompt has 64 tokens; the context is 64"),
        (add("vocab", prompt=[1, 1000]), "token id 1000 in prompt is outside the vocabulary [0, 1000)"),
        (add("neg", prompt=[-1]), "token id -1 in prompt is outside the vocabulary [0, 1000)"),
        (AddRequest("stop-vocab", [1], SamplingParams(stop_token_ids=(5, 1000), min_tokens=1)),
         "token id 1000 in stop_token_ids is outside the vocabulary"),
        (AddRequest("prio", [1], SamplingParams(), priority=2**63), "priority must fit"),
        (AddRequest("nan-arrival", [1], SamplingParams(), arrival_time=float("nan")), "arrival_time must be a finite number"),
        (add("huge", max_tokens=20_000), "max_tokens too large for the fake core"),  # the core's ValueError
        (AddRequest("nan-weight", [1], SamplingParams(), weight=float("nan")), "weight must be a positive finite"),
        (AddRequest("inf-weight", [1], SamplingParams(), weight=float("inf")), "weight must be a positive finite"),
        (AddRequest("zero-weight", [1], SamplingParams(), weight=0.0), "weight must be a positive finite"),
        (AddRequest("bias", [1], SamplingParams(logit_bias=((1000, 5.0),))), "logit_bias names token id 1000"),
    ],
)
def test_bad_requests_get_a_request_error_and_the_engine_goes_on(
    engine: Running, ctx: zmq.Context, request_: AddRequest, problem: str
) -> None:
    gw = RawGateway(ctx, engine.server.address)
    gw.send(request_)
    err = gw.recv()
    assert isinstance(err, Error) and (err.request_id, err.kind) == (request_.request_id, "request")
    assert problem in err.message
    gw.send(add("fine", max_tokens=1))
    assert gw.recv_until_finished({"fine"})


def test_an_adapter_the_engine_does_not_serve_is_model_not_found(engine: Running, ctx: zmq.Context) -> None:
    """Unloaded since the gateway's Ready: the gateway turns this code into a 404 model_not_found."""
    gw = RawGateway(ctx, engine.server.address)
    gw.send(AddRequest("gone", [1], SamplingParams(), lora_name="sql"))
    err = gw.recv()
    assert isinstance(err, Error) and (err.request_id, err.code, err.param) == ("gone", MODEL_NOT_FOUND, "model")


def test_duplicate_request_id_in_flight_is_refused(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    engine.core.step_gate.clear()
    gw.send(add("dup", max_tokens=5))
    assert engine.core.entered_step.wait(5.0)
    gw.send(add("dup", max_tokens=5))
    time.sleep(0.05)
    engine.core.step_gate.set()
    msgs = [gw.recv() for _ in range(3)]
    errors = [m for m in msgs if isinstance(m, Error)]
    assert len(errors) == 1 and errors[0].request_id == "dup" and "already in flight" in errors[0].message
    outputs = [m for m in msgs if isinstance(m, StepOutputs)]
    done = gw.recv_until_finished({"dup"})
    assert sum(len(m.deltas) for m in outputs + done) == 5  # the first one ran undisturbed


def test_garbage_frames_are_answered_and_survived(engine: Running, ctx: zmq.Context) -> None:
    gw = RawGateway(ctx, engine.server.address)
    garbage = [b"", b"\xc1\xff", b"\x93\x01", encode(add("x"))[:-3], encode(Ready(1, ModelInfo("m", 1, 1, None, 1))),
               b"\x92\x63\x01"]
    for frame in garbage:
        gw.sock.send(frame)
    replies = [gw.recv() for _ in garbage]
    assert all(isinstance(r, Error) and r.kind == "request" for r in replies)
    assert "not a msgpack frame" in replies[0].message  # type: ignore[union-attr]
    assert "a gateway may not send Ready" in replies[4].message  # type: ignore[union-attr]
    assert "unknown message tag 99" in replies[5].message  # type: ignore[union-attr]
    gw.sock.send_multipart([b"two", b"frames"])
    assert "exactly one frame" in gw.recv().message  # type: ignore[union-attr]
    gw.send(add("after", max_tokens=2))
    assert gw.recv_until_finished({"after"})


def test_bad_sampling_is_reported_against_its_request(engine: Running, ctx: zmq.Context) -> None:
    import msgpack

    gw = RawGateway(ctx, engine.server.address)
    raw = msgpack.unpackb(encode(add("hot")))
    raw[3]["temperature"] = 5.0
    gw.sock.send(msgpack.packb(raw))
    err = gw.recv()
    assert isinstance(err, Error) and err.request_id == "hot" and "temperature" in err.message


def test_a_failed_step_fails_its_requests_only_and_the_engine_serves_on(engine: Running, ctx: zmq.Context) -> None:
    gw, other = RawGateway(ctx, engine.server.address), RawGateway(ctx, engine.server.address)
    engine.core.step_gate.clear()
    gw.send(add("doomed", max_tokens=50))
    other.send(add("fine", max_tokens=3))
    assert engine.core.entered_step.wait(5.0)
    time.sleep(0.05)
    engine.core.fail_next_step = RequestsFailed(["doomed"], "the step failed: IndexError: boom")
    engine.core.step_gate.set()
    msg = gw.recv()
    while isinstance(msg, StepOutputs):
        msg = gw.recv()
    assert isinstance(msg, Error) and (msg.request_id, msg.kind, msg.code) == ("doomed", "request", REQUEST_FAILED)
    assert other.recv_until_finished({"fine"})[-1].finished[0].reason == "length"
    gw.send(add("next", max_tokens=1))
    assert gw.recv_until_finished({"next"})
    assert gw.stats().num_running == 0 and engine.thread.is_alive()


def test_the_idle_loop_does_not_spin(engine: Running) -> None:
    time.sleep(0.1)
    cpu0 = time.thread_time()  # this thread's CPU; the engine's shows up in process time
    p0 = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - p0 - (time.thread_time() - cpu0) < 0.05


def test_an_ipc_address_works_and_its_socket_file_goes_away(ctx: zmq.Context, tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    running = start_server(listen=f"ipc://{path}")
    assert running.server.address == f"ipc://{path}" and path.exists()
    gw = RawGateway(ctx, running.server.address)
    gw.send(add("over-ipc", max_tokens=2))
    assert gw.recv_until_finished({"over-ipc"})
    assert running.stop() == 0
    assert not path.exists()


def test_main_refuses_a_taken_or_malformed_address_before_loading_anything(
    ctx: zmq.Context, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.serving.main import main

    taken = ctx.socket(zmq.ROUTER)
    taken.bind("tcp://127.0.0.1:*")
    address = taken.getsockopt_string(zmq.LAST_ENDPOINT)
    assert main(["--listen", address]) == 2
    assert f"cannot listen on {address}: Address already in use" in capsys.readouterr().err
    assert main(["--listen", "tcp://no-port-here"]) == 2
    assert "cannot listen on tcp://no-port-here" in capsys.readouterr().err


def test_an_oversized_frame_drops_only_its_sender(engine: Running, ctx: zmq.Context) -> None:
    from engine.serving.server import MAX_MESSAGE_BYTES

    bully, bystander = RawGateway(ctx, engine.server.address), RawGateway(ctx, engine.server.address)
    bully.sock.send(b"\x00" * (MAX_MESSAGE_BYTES + 1))
    bystander.send(add("unharmed", max_tokens=3))
    assert bystander.recv_until_finished({"unharmed"})
    assert not bully.sock.poll(200)  # nothing was decoded from it, nothing answered


def test_one_log_line_per_finished_request_with_counts_and_no_prompt(
    engine: Running, ctx: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="pageserve.engine")
    gw = RawGateway(ctx, engine.server.address)
    gw.send(AddRequest("logged", [911, 912, 913], SamplingParams(max_tokens=3), tenant_id="acme"))
    gw.recv_until_finished({"logged"})
    lines = [r.getMessage() for r in caplog.records if "request logged" in r.getMessage()]
    assert len(lines) == 1
    assert re.fullmatch(r"request logged \(tenant acme\) finished \(length\) in [0-9.]+ s, first token [0-9.]+ s: "
                        r"prompt 3, output 3, cached 0 tokens", lines[0])
    assert not any("911" in r.getMessage() for r in caplog.records)
