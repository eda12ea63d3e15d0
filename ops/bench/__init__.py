"""`pageserve bench NAME`: benchmarks print tables (and can write JSON); they are not tests.

    workloads.py      the named, seeded workloads every command uses (throughput, chat, long, multitenant)
    offline.py        engine vs vLLM's LLM.generate (--vllm-python) vs Hugging Face static batching
    serve.py          streamed HTTP load (load.py arrivals, openai_client.py wire, engine_direct.py engine
                      alone, serve_stats.py metrics, serve_report.py table/JSON/plots, stack.py --spawn)
    vllm_peer.py      vLLM from its own virtualenv (vllm_worker.py runs under its Python); peer_table.py
    agreement.py      bfloat16 greedy agreement with Hugging Face float32, ours and vLLM's
    memory.py         KV waste and requests that fit in a budget: paged vs contiguous
    priority.py, admission.py, streaming.py, step_profile.py   scheduling, quota, SSE and step-time benchmarks
    step_overhead.py  a decode step's Python and torch glue, kernels excluded (issue 13's 3 ms target)
    lora_load.py      issue 43's cold-load must-show: adapter load latency and running streams' ITL
    make_model.py     `make-model SHAPE OUT`: random bfloat16 weights in a real checkpoint's shape
                      (model_shapes.py: the Hub configs) with SmolLM2's tokenizer, for --model FOLDER
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "offline": "ops.bench.offline",
    "priority": "ops.bench.priority",
    "admission": "ops.bench.admission",
    "streaming": "ops.bench.streaming",
    "replicas": "ops.bench.replicas",
    "sampler": "ops.bench.sampler",
    "serve": "ops.bench.serve",
    "memory": "ops.bench.memory",
    "soak": "ops.bench.soak",
    "agreement": "ops.bench.agreement",
    "step-overhead": "ops.bench.step_overhead",
    "make-model": "ops.bench.make_model",
    "lora-load": "ops.bench.lora_load",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: pageserve bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)
