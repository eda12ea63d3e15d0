"""`python -m ops.bench.structured`: what JSON-schema constraints cost, same process, runs alternating.

A short offline workload (default 32 requests, prompts of 32-256 random ids, 32-96 output tokens,
greedy, EOS ignored so every run produces the same number of tokens) is run with no constraint (A)
and with every fourth request constrained by a JSON schema (B), A B A B ...: the two see the same
machine load. A constrained request is masked until its JSON is complete (the grammar then allows
only EOS; with EOS ignored it goes on unmasked), so the table also says how many output tokens were
generated under the grammar. The schema's grammar is compiled before the timed runs (the engine
caches it). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine.config import CacheConfig, EngineConfig, GiB, ModelConfig
from engine.core import EngineCore
from engine.request import Request
from engine.scheduling.config import SchedulerConfig
from ops.bench.offline import make_workload
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "items": {"type": "array", "minItems": 4, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "score": {"type": "integer"},
                                             "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "score", "tags"]}},
    },
    "required": ["title", "items"],
}


def run(core: EngineCore, prompts: list[list[int]], outputs: list[int], every: int) -> tuple[float, int, int]:
    """(seconds, output tokens, output tokens sampled under a grammar); every `every`-th request
    constrained (0: none)."""
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    constrained = set()
    for i, (prompt, n_out) in enumerate(zip(prompts, outputs, strict=True)):
        grammar = spec if every and i % every == 0 else None
        if grammar is not None:
            constrained.add(f"s-{i}")
        params = SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)
        core.add_request(Request(f"s-{i}", prompt, params, arrival_time=0.0, grammar=grammar))
    tokens: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    while core.has_unfinished():
        for d in core.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
    seconds = time.perf_counter() - t0
    eos = core.model_info.eos_token_id
    guided = sum(ids.index(eos) + 1 if eos in ids else len(ids) for rid, ids in tokens.items() if rid in constrained)
    return seconds, sum(len(t) for t in tokens.values()), guided


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="A/B pairs")
    p.add_argument("--every", type=int, default=4, help="constrain every N-th request in B (4: a quarter)")
    p.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(32, 96), metavar=("MIN", "MAX"))
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    core = EngineCore(EngineConfig(
        model=ModelConfig(model=args.model, dtype="float32"),
        cache=CacheConfig(block_size=16, kv_cache_memory=int(1.0 * GiB), swap_space=0),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, enable_prefix_caching=False),
    ))
    w = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), core.model_info.vocab_size,
                      seed=0)
    core.structured.check(GrammarSpec("json_schema", json.dumps(SCHEMA)))  # compiled once, before timing
    run(core, w.prompts[:2], [4, 4], 1)  # warm-up, grammar path included
    print(f"workload: {len(w.prompts)} requests, {w.prompt_tokens} prompt + {w.output_tokens} output tokens, greedy, "
          f"EOS ignored; B constrains every {args.every}th request; {torch.get_num_threads()} threads")
    results: dict[str, list[float]] = {"A": [], "B": []}
    print(f"{'run':<6}{'seconds':>9}{'out tok/s':>11}{'under grammar':>15}")
    for _ in range(args.rounds):
        for name, every in (("A", 0), ("B", args.every)):
            seconds, produced, guided = run(core, w.prompts, w.output_lens, every)
            results[name].append(produced / seconds)
            print(f"{name:<6}{seconds:>9.2f}{produced / seconds:>11.1f}{guided:>15}", flush=True)
    a, b = (sum(v) / len(v) for v in (results["A"], results["B"]))
    print(f"mean A {a:.1f} tok/s, B {b:.1f} tok/s: B is {100 * (1 - b / a):+.1f}% slower")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
