"""`pageserve engine`: flags (each with a PAGESERVE_ENGINE_* twin) -> a loaded core -> the server loop.

The process entry point, kept apart from the loop (engine/serving/server.py) so that the loop's module
knows nothing of flags, and the core factory (which imports torch) loads only once the listen address
is known to be free.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import signal
import sys
from collections.abc import Iterator, Mapping

import zmq

from engine.scheduling.config import SchedulerConfig
from engine.scheduling.slo import LIFT_STALL
from engine.serving.announce import add_announce_args, announced
from engine.serving.server import EngineServer, ServerConfig
from shared.cli_env import add_env_twins
from shared.gc_pauses import freeze_startup_objects

log = logging.getLogger("pageserve.engine")

# Serving defaults: while streams generate, a step carrying prompt tokens may take at most
# SERVING_STALL_FACTOR x a decode-only step, as the engine measures its own steps
# (engine/scheduling/step_cost.py), and never carry more than SERVING_PREFILL_BUDGET prompt tokens.
# A fixed token budget bounds the stall differently on each host and load: 64 tokens gave p99 inter-token
# latency 2.7x the median at 8 streams on an AVX-512 Xeon, 3.1-3.5x on a Zen 4 EPYC, and held prompts back
# when many streams ran (long decode steps, where a longer chunk barely shows).
# `--prefill-stall-factor 0 --max-prefill-while-decoding 64` is the old fixed budget.
SERVING_PREFILL_BUDGET = 256
SERVING_STALL_FACTOR = 2.0
# While prompts wait (those queued for a second or more: step_cost.BACKLOG_AGE_S), steps carry enough of them
# to drain that backlog within about this long (up to the step's token budget, and a step ~SATURATED_STALL x
# a decode step: step_cost.py has the numbers of the night of 2026-12-06). Under the stall
# bound alone a saturated server admitted prompts over 20 s at 8 requests/s of 256-token prompts (Zen 4,
# bfloat16) and decoded small batches: 265-310 out tok/s where vLLM, admitting first, did 302. With 0.5 s
# (prompts waiting 1 s, at most SERVING_PREFILL_BUDGET a step): 311-334, TTFT p50 3.0-4.0 s against 6.0-7.1 s.
# On an Intel Xeon with AMX (bfloat16, the same load) that still left TTFT p50 at 1,754 ms (vLLM 254) and
# goodput (TTFT <= 1 s, TPOT <= 100 ms) at 1.30 req/s (vLLM 3.57); 0.1 s, waiting 0.5 s, up to whole steps:
# TTFT p50 845 ms, goodput 3.66, 525 out tok/s (vLLM 457), TPOT 64 ms (89), p99 ITL 160 ms (296); at
# 2 requests/s unchanged (231.9 out tok/s, TPOT 24 ms, p99 ITL 46 ms; vLLM 215.7, 44, 102).
SERVING_BACKLOG_DRAIN_S = 0.1
# The serving targets (engine/scheduling/slo.py): while streams generate, the prompts waiting are planned to end
# their prefill within SERVING_TTFT_TARGET_MS of their arrival at the engine, in steps of at most
# SERVING_ITL_TARGET_MS: at light load a prompt goes whole into the next step (~190 ms for 256 tokens of SmolLM2,
# bfloat16, Zen 4), under overload the queue drains in steps of up to a second, as vLLM's do (its p99 ITL at
# 8 requests/s: 1,413 ms). Fed in steps of at most 2.75 decode steps instead (--ttft-stall-limit 2.75, the
# default before), the streams were smoother (p99 ITL 51-81 ms against ~190 ms) but a prompt took 4-5 steps:
# TTFT p50 388-446 ms at 2 requests/s against vLLM's 310 and 3.6 s at 8/s against its 2.6 s (Zen 4, bfloat16,
# `pageserve bench serve --random 64 256 128`); whole prompts: 195-204 ms and 2.0 s.
SERVING_TTFT_TARGET_MS = 150.0
SERVING_ITL_TARGET_MS = 1000.0


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The engine's flags; `environ` (default os.environ) supplies their PAGESERVE_* twins."""
    p = argparse.ArgumentParser(prog="pageserve engine", description="Run the engine process.")
    p.add_argument("--model", default="smollm2", help="short name or local Hugging Face folder")
    p.add_argument("--listen", default="tcp://127.0.0.1:5555", help="tcp://HOST:PORT or ipc:///PATH")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on a GPU or a CPU with AVX512-BF16/AMX, else float32")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the smaller of the model's context and 2048 (SchedulerConfig.max_model_len)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--kv-cache-memory", type=float, default=2.0, help="GiB for the device KV pool")
    p.add_argument("--swap-space", type=float, default=0.5, help="GiB for the CPU swap pool")
    p.add_argument("--num-blocks", type=int, default=None, help="force the device block count")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests running at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    add_serving_args(p)
    p.add_argument("--no-prefix-caching", action="store_true", help="never reuse KV blocks of equal prompt prefixes")
    p.add_argument("--policy", default="priority", choices=["priority", "fcfs"],
                   help="admission order: (aged) priority then fair share, or arrival only")
    p.add_argument("--preemption-mode", default="auto", choices=["auto", "swap", "recompute"],
                   help="what a preempted request's KV becomes: swapped to CPU, dropped, or chosen per victim")
    p.add_argument("--preemption-priority-gap", type=int, default=1,
                   help="levels more urgent a waiting request must be to preempt a running one")
    p.add_argument("--aging-rate", type=float, default=0.1, help="priority levels gained per second waited")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="attention kernels: Triton on a GPU, our C/torch path on a CPU (auto picks)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice); with tensor parallelism, shared by the ranks")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="processes that each hold a shard of every layer (CPU, torch.distributed gloo); "
                        "at most the model's KV heads")
    p.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds in-flight requests get on SIGTERM")
    p.add_argument("--request-deadline", type=float, default=None,
                   help="seconds a request may stay in flight before it is aborted (request_deadline_s; default: none)")
    p.add_argument("--curve-dir", default=None,
                   help="ZeroMQ CURVE key folder (pageserve curve-keys): authenticate and encrypt the socket")
    p.add_argument("--log-level", default="INFO", help="CRITICAL, ERROR, WARNING, INFO or DEBUG")
    add_announce_args(p)
    p.add_argument("--enable-lora", action="store_true",
                   help="a request's model may name a LoRA adapter (docs/serving-models.md#lora-adapters)")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help="adapters to load at start-up: PEFT folders (adapter_config.json, adapter_model.safetensors)")
    p.add_argument("--max-loras", type=int, default=4, help="distinct adapters in one step (base requests not counted)")
    p.add_argument("--max-lora-rank", type=int, default=64, help="the largest adapter rank accepted")
    p.add_argument("--max-cpu-loras", type=int, default=32,
                   help="adapters whose weights stay in memory; others are read again, off the step loop, on use")
    p.add_argument("--default-sampling", default=None, metavar="JSON",
                   help="sampling defaults for fields a request leaves out, over the model's generation_config.json,"
                        " e.g. '{\"temperature\": 0.7, \"top_p\": 0.9}'")
    add_env_twins(p, ENV_PREFIX, ENV_NAMES, environ)  # every flag also reads PAGESERVE_ENGINE_<FLAG> (shared/cli_env.py)
    return p


def add_serving_args(p: argparse.ArgumentParser) -> None:
    """How steps share time between generating streams and new prompts (engine/scheduling/slo.py, step_cost.py)."""
    p.add_argument("--max-prefill-while-decoding", type=int, default=SERVING_PREFILL_BUDGET,
                   help="prompt tokens a step may compute while streams are generating: bounds the stall a "
                        "new prompt causes them (0: only the step budget)")
    p.add_argument("--prefill-stall-factor", type=float, default=SERVING_STALL_FACTOR,
                   help="while streams generate, a step with prompt tokens may take at most this many times a "
                        "decode-only step, as measured on this host (0: --max-prefill-while-decoding alone)")
    p.add_argument("--prefill-backlog-drain", type=float, default=SERVING_BACKLOG_DRAIN_S,
                   help="seconds: while prompts queued for a second or more wait, steps carry enough of them "
                        "to drain them within about this long, up to --max-num-batched-tokens and a step about 4x a "
                        "decode step (TTFT and throughput under load for longer steps; 0: off, the stall bound alone)")
    p.add_argument("--ttft-target-ms", type=float, default=SERVING_TTFT_TARGET_MS,
                   help="while streams generate, steps carry enough prompt tokens that each prompt's first token "
                        "is due this long after it reached the engine, within the ITL bounds (0: off)")
    p.add_argument("--itl-target-ms", type=float, default=SERVING_ITL_TARGET_MS,
                   help="the longest step the queue's floors or a TTFT deadline may plan while streams generate "
                        "(2x a decode step where that is longer); when both targets cannot be met this wins "
                        "(0: no bound)")
    p.add_argument("--ttft-stall-limit", type=float, default=SchedulerConfig.ttft_stall_limit,
                   help="smoother streams for later first tokens: a step lifted for a TTFT deadline routinely takes "
                        f"at most this many decode steps, only a few a minute up to --itl-target-ms (e.g. {LIFT_STALL}: "
                        "p99 gaps about 3x the median; 0: off, deadlines lift steps up to --itl-target-ms)")


ENV_PREFIX = "PAGESERVE_ENGINE_"
ENV_NAMES = {"model": "PAGESERVE_MODEL"}
"""The model is named the same for the engine and the gateway (they must agree)."""


def _exit_during_startup(signum: int, frame: object) -> None:
    log.info("stopped by signal %d while starting", signum)
    raise SystemExit(0)


def _probe_listen(address: str) -> None:
    """Raise ValueError if the address cannot be bound (taken, malformed)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(address)
    except zmq.ZMQError as e:
        raise ValueError(f"cannot listen on {address}: {e}") from None
    finally:
        sock.close(linger=0)
        ctx.term()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for sig in (signal.SIGTERM, signal.SIGINT):  # nothing admitted yet, nobody to tell: just leave
        signal.signal(sig, _exit_during_startup)
    try:
        _probe_listen(args.listen)  # fail at once, not after torch and the model loaded
        log.info("loading model %s (%s)", args.model, args.dtype)
        from engine.serving.core_factory import build_core  # torch and the model load only here

        core = build_core(args)
    except ValueError as e:  # a configuration error: say it plainly, no traceback
        print(f"pageserve engine: {e}", file=sys.stderr)
        return 2
    server = EngineServer(core, core.model_info, ServerConfig(listen=args.listen, shutdown_grace_s=args.shutdown_grace,
                                                   request_deadline_s=args.request_deadline,
                                                   curve_dir=args.curve_dir))
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack: a slow step shows
    freeze_startup_objects()  # torch's and the model's objects: one full collection of them stalled a step 86 ms
    with announced(args, server.address, core.model_info) as announcer, stop_signals(server):
        if announcer is not None:  # adapters loaded or unloaded at run time are re-announced at once
            server.on_model_update = announcer.update
        return server.serve()


@contextlib.contextmanager
def stop_signals(server: EngineServer) -> Iterator[None]:
    """SIGTERM and SIGINT stop the server gracefully, whichever thread the kernel hands them to."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    signal.set_wakeup_fd(server.wakeup_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
