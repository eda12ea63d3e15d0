"""`pageserve generate "prompt"`: offline generation from the command line (the interim serve demo).

Wraps the prompt in the model's chat template (unless --raw), runs it through
the offline `LLM` and prints the completion.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from engine.llm import LLM
from shared.sampling import SamplingError, SamplingParams


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve generate", description=__doc__)
    p.add_argument("prompt", nargs="+", help="one or more prompts (each answered separately)")
    p.add_argument("--model", default="smollm2", help="short name or local HF folder (default: smollm2)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("-v", "--verbose", action="store_true", help="print token counts and timing to stderr")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
            max_tokens=args.max_tokens,
        )
    except SamplingError as exc:
        print(f"pageserve generate: --{exc.param.replace('_', '-')}: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype)
    prompts = [p if args.raw else llm.encode_chat(p) for p in args.prompt]
    t1 = time.perf_counter()
    results = llm.generate(prompts, params)
    t2 = time.perf_counter()
    for r in results:
        print(r.text.strip() if len(results) == 1 else f"- {r.text.strip()}")
    if args.verbose:
        n_out = sum(len(r.token_ids) for r in results)
        print(f"[load {t1 - t0:.1f}s, {n_out} tokens in {t2 - t1:.2f}s ({n_out / (t2 - t1):.1f} tok/s), "
              f"finish: {', '.join(str(r.finish_reason) for r in results)}]", file=sys.stderr)
    return 0
