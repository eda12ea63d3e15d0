"""`pageserve bench agreement`: how often bfloat16 greedy outputs agree with Hugging Face float32, ours and vLLM's.

    reference  transformers `generate` in float32, one prompt at a time (no padding), greedy, EOS ignored
    pageserve  the engine in --dtype (default bfloat16), all requests at once (continuous batching)
    vllm       `--vllm-python PATH`: vLLM's offline LLM.generate in --dtype on the same token ids

The workload is the standard `throughput` one (ops/bench/workloads.py), its first
--num-requests requests with outputs cut to --output-len tokens. For each system it prints
the share of requests whose first generated token is the reference's, and the share of
tokens before a request's first divergence (sum of common-prefix lengths over all tokens):
after a divergence the contexts differ, so later tokens say nothing. Float32 engines agree
everywhere (the parity tests hold that); bfloat16 rounds every product, and near-ties in
the logits flip. Issue 13 asks pageserve's bfloat16 to agree at least as often as vLLM's.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import CacheConfig, EngineConfig, GiB, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from ops.bench.vllm_peer import run_worker
from ops.bench.workloads import Workload, WorkloadRequest, get_workload
from shared.model_store import cache_dir
from shared.sampling import SamplingParams


@dataclass(frozen=True)
class Agreement:
    system: str
    first_token: float
    """Share of requests whose first token is the reference's."""
    prefix: float
    """Share of all tokens that come before their request's first divergence."""
    error: str | None = None


def agreement(system: str, outputs: list[list[int]], reference: list[list[int]]) -> Agreement:
    firsts = sum(o[:1] == r[:1] for o, r in zip(outputs, reference, strict=True))
    common = 0
    for out, ref in zip(outputs, reference, strict=True):
        n = 0
        while n < min(len(out), len(ref)) and out[n] == ref[n]:
            n += 1
        common += n
    total = sum(len(r) for r in reference)
    return Agreement(system, firsts / len(reference), common / total if total else 1.0)


def cached_hf_reference(model_dir: str, w: Workload) -> list[list[int]]:
    """hf_reference, kept on disk under the cache directory: it takes minutes on 2 cores and depends
    only on the weights, the prompts, the lengths and the transformers version."""
    import transformers

    weights = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(model_dir).glob("*.safetensors"))
    key = json.dumps([model_dir, weights, w.prompts, w.output_lens, transformers.__version__], default=list)
    path = cache_dir() / "bench" / f"agreement-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.exists():
        print(f"  reference from {path}", flush=True)
        return json.loads(path.read_text())
    outs = hf_reference(model_dir, w)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outs))
    return outs


def hf_reference(model_dir: str, w: Workload) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for prompt, n in zip(w.prompts, w.output_lens, strict=True):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
            outs.append(out[0, len(prompt):].tolist())
    return outs


def engine_outputs(core: EngineCore, w: Workload) -> list[list[int]]:
    tokens: dict[str, list[int]] = {}
    for i, (prompt, n) in enumerate(zip(w.prompts, w.output_lens, strict=True)):
        core.add_request(Request(f"agree-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                                 arrival_time=0.0))
        tokens[f"agree-{i}"] = []
    while core.has_unfinished():
        for delta in core.step():
            tokens[delta.request_id] += delta.new_token_ids
    return [tokens[f"agree-{i}"] for i in range(len(w.prompts))]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve bench agreement", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32, help="each request's outputs cut to this many tokens")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--vllm-python", metavar="PATH", help="vLLM's Python (its own virtualenv)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    core = EngineCore(EngineConfig(model=ModelConfig(model=args.model, dtype=args.dtype),
                                   cache=CacheConfig(kv_cache_memory=2 * GiB, swap_space=0)))
    full = get_workload("throughput", core.model_info.vocab_size)
    w = Workload("agreement", tuple(WorkloadRequest(r.prompt, min(r.output_len, args.output_len))
                                    for r in full.requests[: args.num_requests]))
    model_dir = str(core.model_path)
    print(f"{len(w.prompts)} throughput requests, {w.output_tokens} output tokens; reference: HF float32", flush=True)
    t0 = time.perf_counter()
    reference = cached_hf_reference(model_dir, w)
    print(f"  reference done in {time.perf_counter() - t0:.1f}s", flush=True)
    rows = [agreement(f"pageserve {args.dtype}", engine_outputs(core, w), reference)]
    del core  # its KV pool goes before vLLM allocates its own
    out = run_worker(args.vllm_python, model_dir, args.dtype, w, threads=args.threads, return_tokens=True)
    rows.append(Agreement(f"vLLM {args.dtype}", 0.0, 0.0, error=out) if isinstance(out, str)
                else agreement(f"vLLM {args.dtype} {out.get('vllm_version', '')}", out["token_ids"], reference))
    print(f"{'system':<28} {'first token':>12} {'tokens before divergence':>26}")
    for r in rows:
        print(f"{r.system:<28} " + (r.error or f"{100 * r.first_token:>11.1f}% {100 * r.prefix:>25.1f}%"))
    return 0
