"""`pageserve bench offline`: this engine against vLLM and Hugging Face static batching, one workload.

`--workload` picks a named workload (ops/bench/workloads.py; default `throughput`).
Standard workload (seed 0): 64 requests, prompt lengths uniform in [32, 512] of
random non-special token ids, output lengths uniform in [16, 256], greedy, EOS
ignored; numpy's default_rng(0) draws 17,709 prompt and 8,885 output tokens.

  engine   all requests submitted at once to EngineCore (continuous batching, paged KV)
  vllm     `--vllm-python PATH`: vLLM's offline LLM.generate in a subprocess from its own
           virtualenv (ops/bench/vllm_peer.py), same token ids, greedy, EOS ignored
  hf       transformers `generate` on left-padded static batches in arrival order; each
           batch runs to its longest output (only requested tokens count); every
           batch size of --hf-batch-sizes
`--prefix-caching both` runs the engine and vLLM with it off, then on. One table
lists every system (a missing one with the reason) and pageserve's ratio to each.
All use the same model folder and dtype. Prints output tokens/s of each and the
ratio, and the KV cache waste at the engine's peak allocation (allocated slots
not holding a token, over allocated slots) beside what contiguous reservations
would have wasted for the same running requests. `--profile` adds a second,
profiled engine run and prints where a step's time goes (ops/bench/step_profile.py).
`--json PATH` writes the numbers.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from engine.config import CacheConfig, EngineConfig, GiB, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from engine.worker import host_allocator
from ops.bench.peer_table import print_peer_table
from ops.bench.step_profile import format_profile, profile_steps
from ops.bench.vllm_peer import PeerResult, run_offline
from ops.bench.workloads import WORKLOADS, Workload, get_workload, make_random
from pageserve_kernels.isa_cap import host_summary
from shared.sampling import SamplingParams


def make_workload(n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int,
                  seed: int = 0) -> Workload:
    """The throughput workload's shape with other sizes (ops/bench/workloads.py owns the definition)."""
    return make_random(n, prompt_range, output_range, vocab, seed)


@dataclass
class WasteTracker:
    """KV slots at the step of peak allocation, and what contiguous reservations would take."""

    max_model_len: int
    peak_allocated: int = 0
    held_at_peak: int = 0
    running_at_peak: int = 0
    reserved_exact_at_peak: int = 0
    """Contiguous reservation of prompt + max_tokens per running request (needs an oracle)."""

    def observe(self, running: list[Request], block_size: int) -> None:
        allocated = sum(len(r.block_ids) for r in running) * block_size
        if allocated > self.peak_allocated:
            self.peak_allocated = allocated
            self.held_at_peak = sum(r.num_computed_tokens for r in running)
            self.running_at_peak = len(running)
            self.reserved_exact_at_peak = sum(r.num_prompt_tokens + r.sampling.max_tokens for r in running)

    def report(self) -> dict[str, float]:
        def waste(slots: int) -> float:
            return 1.0 - self.held_at_peak / slots if slots else 0.0

        return {
            "paged": waste(self.peak_allocated),
            "contiguous_max_model_len": waste(self.running_at_peak * self.max_model_len),
            "contiguous_prompt_plus_max_tokens": waste(self.reserved_exact_at_peak),
            "peak_allocated_slots": self.peak_allocated,
            "running_at_peak": self.running_at_peak,
        }


@dataclass
class EngineRun:
    seconds: float
    output_tokens: int
    steps: int
    waste: dict[str, float] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.seconds


def run_engine(core: EngineCore, w: Workload) -> EngineRun:
    tracker = WasteTracker(core.model_info.max_model_len)
    for i, (prompt, n_out) in enumerate(zip(w.prompts, w.output_lens, strict=True)):
        params = SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        core.add_request(Request(f"bench-{i}", prompt, params, arrival_time=0.0))
    produced, steps = 0, 0
    t0 = time.perf_counter()
    while core.has_unfinished():
        produced += sum(len(d.new_token_ids) for d in core.step())
        steps += 1
        tracker.observe(core.scheduler.running, core.model_info.block_size)
    seconds = time.perf_counter() - t0
    assert produced == w.output_tokens, f"engine produced {produced} tokens, wanted {w.output_tokens}"
    return EngineRun(seconds, produced, steps, tracker.report())


def run_hf(model: Any, w: Workload, batch_size: int, pad_id: int) -> float:
    """Seconds for HF static batching: left-padded batches in arrival order."""
    t0 = time.perf_counter()
    for start in range(0, len(w.prompts), batch_size):
        prompts = w.prompts[start : start + batch_size]
        longest = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        n_new = max(w.output_lens[start : start + batch_size])
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                           pad_token_id=pad_id)
    return time.perf_counter() - t0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve bench offline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, nargs=2, default=(32, 512), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-batch-sizes", default="16,32,64", help="comma list; the best counts (default 16,32,64)")
    p.add_argument("--skip-hf", action="store_true", help="run only this engine")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="the engine as N processes sharing every layer (gloo); the threads are split between them")
    p.add_argument("--profile", action="store_true",
                   help="after the timed run, run the workload again under cProfile and print where a step's time goes")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--workload", default="throughput", choices=list(WORKLOADS),
                   help="named workload (ops/bench/workloads.py); the size flags above shape only `throughput`")
    p.add_argument("--limit", type=int, default=None,
                   help="only the first N requests of a named workload other than throughput (a quick look)")
    p.add_argument("--prefix-caching", default="off", choices=["off", "on", "both"],
                   help="engine (and vLLM) prefix caching; `both` runs each system with it off, then on")
    p.add_argument("--vllm-python", metavar="PATH",
                   help="vLLM's Python (its own virtualenv): run its offline LLM.generate on the same workload")
    return p.parse_args(argv)


def _engine_config(args: argparse.Namespace, prefix_caching: bool) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=args.model, dtype=args.dtype),
        cache=CacheConfig(block_size=args.block_size, kv_cache_memory=int(args.kv_cache_gib * GiB), swap_space=0),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                                  enable_prefix_caching=prefix_caching),
        tensor_parallel_size=args.tensor_parallel_size,
    )


def _workload(args: argparse.Namespace, vocab: int) -> Workload:
    if args.workload == "throughput":  # the sizes stay adjustable; the defaults are the named workload
        return make_random(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), vocab, args.seed)
    w = get_workload(args.workload, vocab, args.seed)
    return Workload(w.name, w.requests[: args.limit], w.seed) if args.limit else w


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {"off": [False], "on": [True], "both": [False, True]}[args.prefix_caching]
    rows: list[PeerResult] = []
    results: dict[str, Any] = {"dtype": args.dtype, "threads": torch.get_num_threads(), "engine": {}}
    core = w = None
    for caching in settings:
        if core is not None:
            core.close()  # its tensor-parallel workers, if any
        core = None  # the previous core's KV pool goes before the next one is allocated
        core = EngineCore(_engine_config(args, caching))
        w = _workload(args, core.model_info.vocab_size)
        if not rows:
            print(f"workload {args.workload}: {len(w.prompts)} requests, {w.prompt_tokens} prompt + "
                  f"{w.output_tokens} output tokens, greedy, EOS ignored; model {core.model_info.model_name} {args.dtype}, "
                  f"{torch.get_num_threads()} threads\nhost: {host_summary()}")
        run_engine(core, make_workload(2, (8, 8), (4, 4), core.model_info.vocab_size, seed=1))  # warm-up
        eng = run_engine(core, w)
        tp = f" TP={args.tensor_parallel_size}" if args.tensor_parallel_size > 1 else ""
        name = f"pageserve engine{tp}{' +prefix cache' if caching else ''}"
        print(f"  {name}: {eng.seconds:.1f}s, {eng.tok_s:.1f} output tok/s, {eng.steps} steps", flush=True)
        rows.append(PeerResult(name, eng.seconds, eng.output_tokens, prefix_caching=caching))
        results["engine"]["prefix_caching_on" if caching else "prefix_caching_off"] = {**asdict(eng), "tok_s": eng.tok_s}
    assert core is not None and w is not None
    results["workload"] = {"name": args.workload, "requests": len(w.prompts), "prompt_tokens": w.prompt_tokens,
                           "output_tokens": w.output_tokens, "seed": args.seed}
    if args.profile:
        prof = profile_steps(core, w.prompts, w.output_lens)
        print(format_profile(prof), flush=True)
        results["profile"] = asdict(prof)
    model_path, max_model_len = str(core.model_path), core.model_info.max_model_len
    if args.skip_hf:  # the peer loads its own copy of the weights: ours (and their packed copies) go first
        core.close()
        core = None
        gc.collect()
        host_allocator.return_freed_memory()  # else this process keeps GiBs of freed heap beside the peer
    for caching in settings:
        peer = run_offline(args.vllm_python, model_path, args.dtype, w, caching, threads=args.threads)
        print(f"  {peer.name}: " + (peer.error or f"{peer.seconds:.1f}s, {peer.tok_s:.1f} output tok/s"), flush=True)
        rows.append(peer)
    if core is not None:
        hf_runs = _bench_hf(core, w, args)
        results["hf_static"] = hf_runs
        rows += [PeerResult(f"HF static generate, batch {r['batch_size']}", r["seconds"], w.output_tokens)
                 for r in hf_runs]
    else:
        rows.append(PeerResult("HF static generate", error="not run: --skip-hf"))
    results["systems"] = [{**asdict(r), "tok_s": r.tok_s} for r in rows]
    print_peer_table(rows, title=f"bench offline, workload {args.workload}, {args.dtype}")
    waste = eng.waste
    print(f"KV waste at peak allocation ({waste['running_at_peak']} running, {waste['peak_allocated_slots']} slots): "
          f"paged {100 * waste['paged']:.2f}%, contiguous max_model_len={max_model_len} "
          f"{100 * waste['contiguous_max_model_len']:.1f}%, contiguous prompt+max_tokens "
          f"{100 * waste['contiguous_prompt_plus_max_tokens']:.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _bench_hf(core: EngineCore, w: Workload, args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(core.model_path, dtype=getattr(torch, args.dtype))
    model.eval()
    pad = core.model_info.eos_token_id or 0
    run_hf(model, make_workload(2, (8, 8), (4, 4), core.model_info.vocab_size, seed=1), 2, pad)  # warm-up
    out = []
    for bs in (int(b) for b in args.hf_batch_sizes.split(",")):
        secs = run_hf(model, w, bs, pad)
        out.append({"batch_size": bs, "seconds": secs, "tok_s": w.output_tokens / secs})
        print(f"  HF static batch {bs}: {secs:.1f}s, {w.output_tokens / secs:.1f} output tok/s", flush=True)
    return out
