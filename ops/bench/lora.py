"""LoRA throughput, one run: base requests on an engine with --enable-lora (the same code path as LoRA
off: a step without adapter rows builds no LoRA batch; --with-disabled adds an engine without LoRA to
show it), and `--adapters` distinct random adapters (rank `--rank` on all seven projections) mixed in
the batch. `--registered N` registers N adapters in all (the rest idle, under other names, reading the
first one's folder): they must cost nothing while no request names them. `--model` takes a short name or
a model folder (`pageserve bench make-model` writes random weights in a real checkpoint's shape).

    python -m ops.bench.lora --model smollm2 --dtype bfloat16 --batch 16 --output 32
    python -m ops.bench.lora --model /work/models/llama-3.2-1b --with-disabled --registered 100

Prints one table (output tokens/s, best of `--repeat` interleaved runs, and the ratio to the base) and,
with --json, writes it. Random PEFT folders are written with safetensors directly (no peft needed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.config import LoraConfig
from engine.llm import LLM
from shared.sampling import SamplingParams

TARGETS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def target_shapes(spec) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(in, out) of each of the seven target projections of `spec` (a ModelSpec)."""
    h, q, kv, inter = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}


def random_adapter(folder: Path, spec, rank: int, seed: int) -> Path:  # type: ignore[no-untyped-def]
    """A PEFT folder with random float32 A and B (B non-zero) for every layer and target of `spec`."""
    shapes = target_shapes(spec)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for target, block in TARGETS.items():
            d_in, d_out = shapes[target]
            key = f"base_model.model.model.layers.{layer}.{block}.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=g) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=g) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}))
    return folder


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams, loras: list[str]) -> float:
    began = time.perf_counter()
    out = llm.generate(prompts, params, detokenize=False, lora=loras)
    return sum(len(r.token_ids) for r in out) / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ops.bench.lora", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=24)
    p.add_argument("--output", type=int, default=32)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--registered", type=int, default=0,
                   help="adapters registered in all (at least --adapters); the others idle, never requested")
    p.add_argument("--with-disabled", action="store_true", help="also time an engine without --enable-lora")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    base = LLM(args.model, args.dtype, max_model_len=512) if args.with_disabled else None
    from engine.worker.model_loader import read_architecture
    from shared.model_store import resolve_model

    spec, _ = read_architecture(resolve_model(args.model).config)
    # the folders outlive the loads: an adapter evicted past --max-cpu-loras is read from them again
    folders = tempfile.TemporaryDirectory()
    names = [f"lora{i}" for i in range(args.adapters)]
    modules = tuple((n, str(random_adapter(Path(folders.name) / n, spec, args.rank, i))) for i, n in enumerate(names))
    idle = tuple((f"idle{i}", modules[0][1]) for i in range(max(0, args.registered - args.adapters)))
    lora = LLM(args.model, args.dtype, max_model_len=512,
               lora=LoraConfig(enabled=True, modules=modules + idle, max_loras=args.adapters,
                               max_lora_rank=args.rank, max_cpu_loras=max(32, args.adapters)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, spec.vocab_size, (args.prompt,), generator=g).tolist() for _ in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output, ignore_eos=True)
    enabled = "base, LoRA enabled"
    runs = {enabled: (lora, [""] * args.batch),
            f"{args.adapters} adapters mixed": (lora, [names[i % len(names)] for i in range(args.batch)])}
    if base is not None:
        runs = {"base, LoRA disabled": (base, [""] * args.batch), **runs}
    for llm, loras in runs.values():  # warm-up: kernel choices, allocator
        llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4), detokenize=False, lora=loras[:2])
    best = {name: 0.0 for name in runs}
    for _ in range(args.repeat):
        for name, (llm, loras) in runs.items():
            best[name] = max(best[name], timed(llm, prompts, params, loras))
    ref = best.get("base, LoRA disabled", best[enabled])
    print(f"{args.model} {args.dtype}, batch {args.batch}, prompt {args.prompt}, output {args.output}, rank {args.rank}, "
          f"{len(modules) + len(idle)} adapters registered")
    print(f"{'run':<24} {'tokens/s':>10} {'vs base':>8}")
    for name, tps in best.items():
        print(f"{name:<24} {tps:>10.1f} {tps / ref:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "tokens_per_s": best}, indent=1))
    folders.cleanup()


if __name__ == "__main__":
    main()
