"""`pageserve bench make-model SHAPE OUT`: a random-weight Hugging Face folder of a real checkpoint's shape.

    pageserve bench make-model llama-3.2-1b /models/llama-3.2-1b-random
    pageserve bench offline --model /models/llama-3.2-1b-random --dtype bfloat16

OUT gets the shape's config.json (model_shapes.py: the Hub's, bos/eos set to SmolLM2's),
generation_config.json, SmolLM2's tokenizer files (from the model store) and the
weights in bfloat16 safetensors: model.safetensors, or ~2 GB shards
model-0000K-of-0000N.safetensors with model.safetensors.index.json, as save_pretrained
names them. Tensor names are the Hub's for that architecture (per-expert names for a
mixture of experts, as its checkpoints hold them).

Each tensor is drawn from its own torch.Generator seeded from (--seed, its name), so a
folder is reproducible and a shard's bytes do not depend on the others: matrices
normal(0, 0.02), biases normal(0, 0.02), norm weights 1. One shard is in memory at a
time (its tensors drawn one per core) and transformers' model is never built: a 3 B
shape's 6.4 GB take ~40 s of CPU and ~2.2 GB of RAM.

Why random weights: throughput, latency and memory depend on the shape only. Greedy
text from random weights is meaningless (and stops on EOS at random), so benchmarks
run them with EOS ignored. SmolLM2's vocabulary (49,152) is smaller than every shape's,
so its token ids are all valid; ids above it are never produced by the tokenizer.

`--layers N` and `--set KEY=VALUE` make it no real shape any more: for quick tests.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ops.bench.model_shapes import SHAPES
from shared.model_store import resolve_model

SHARD_BYTES = 2 * 10**9
"""A shard's size before the next one starts (save_pretrained's default is 5 GB; vLLM reads either)."""
TOKENIZER_MODEL = "smollm2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
STD = 0.02
"""The Hub configs' initializer_range: activations stay O(1) through a few dozen layers."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str
    """"normal" (std STD) or "ones" (norm weights)."""

    @property
    def nbytes(self) -> int:
        n = 2  # bfloat16
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class MadeModel:
    path: Path
    files: list[str]
    parameters: int
    nbytes: int
    seconds: float


def _attention(p: str, c: dict[str, Any]) -> Iterator[TensorSpec]:
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    hidden, head_dim = c["hidden_size"], c.get("head_dim") or c["hidden_size"] // heads
    rows = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
    bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)  # Qwen2 always has q/k/v biases
    for n, out in rows.items():
        yield TensorSpec(f"{p}self_attn.{n}_proj.weight", (out, hidden), "normal")
        if bias:
            yield TensorSpec(f"{p}self_attn.{n}_proj.bias", (out,), "normal")
    yield TensorSpec(f"{p}self_attn.o_proj.weight", (hidden, heads * head_dim), "normal")
    if c["model_type"] in ("qwen3", "qwen3_moe"):  # per-head RMSNorm of q and k before rotary
        yield TensorSpec(f"{p}self_attn.q_norm.weight", (head_dim,), "ones")
        yield TensorSpec(f"{p}self_attn.k_norm.weight", (head_dim,), "ones")


def _gated_mlp(p: str, hidden: int, inter: int) -> Iterator[TensorSpec]:
    yield TensorSpec(f"{p}gate_proj.weight", (inter, hidden), "normal")
    yield TensorSpec(f"{p}up_proj.weight", (inter, hidden), "normal")
    yield TensorSpec(f"{p}down_proj.weight", (hidden, inter), "normal")


def _is_sparse(c: dict[str, Any], layer: int) -> bool:
    """Qwen3-MoE's rule (transformers' Qwen3MoeDecoderLayer): experts unless listed in mlp_only_layers."""
    return (c["model_type"] == "qwen3_moe" and layer not in c.get("mlp_only_layers", [])
            and c.get("num_experts", 0) > 0 and (layer + 1) % c.get("decoder_sparse_step", 1) == 0)


def tensor_specs(c: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of config `c`'s checkpoint, with the Hub's names, in save order."""
    if c["model_type"] not in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe"):
        raise ValueError(f"model_type {c['model_type']!r}: make-model writes llama, mistral, qwen2, qwen3, qwen3_moe")
    hidden = c["hidden_size"]
    specs = [TensorSpec("model.embed_tokens.weight", (c["vocab_size"], hidden), "normal")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs.append(TensorSpec(p + "input_layernorm.weight", (hidden,), "ones"))
        specs += _attention(p, c)
        specs.append(TensorSpec(p + "post_attention_layernorm.weight", (hidden,), "ones"))
        if _is_sparse(c, i):
            specs.append(TensorSpec(p + "mlp.gate.weight", (c["num_experts"], hidden), "normal"))  # the router
            for e in range(c["num_experts"]):
                specs += _gated_mlp(f"{p}mlp.experts.{e}.", hidden, c["moe_intermediate_size"])
        else:
            specs += _gated_mlp(p + "mlp.", hidden, c["intermediate_size"])
    specs.append(TensorSpec("model.norm.weight", (hidden,), "ones"))
    if not c.get("tie_word_embeddings", False):
        specs.append(TensorSpec("lm_head.weight", (c["vocab_size"], hidden), "normal"))
    return specs


def plan_shards(specs: list[TensorSpec], max_bytes: int = SHARD_BYTES) -> list[list[TensorSpec]]:
    """Tensors in order, a new shard when the next would pass max_bytes (one larger tensor gets its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def random_tensor(spec: TensorSpec, seed: int) -> torch.Tensor:
    """The tensor's values depend on (seed, name) only: any shard can be rewritten alone."""
    if spec.init == "ones":
        return torch.ones(spec.shape, dtype=torch.bfloat16)
    digest = hashlib.sha256(f"{seed}:{spec.name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.empty(spec.shape, dtype=torch.bfloat16).normal_(0.0, STD, generator=gen)


def shaped_config(shape: str, layers: int | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shape's config.json with any test overrides (the bos/eos ids are set when it is written)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: give one of {', '.join(SHAPES)}")
    config: dict[str, Any] = copy.deepcopy(dict(SHAPES[shape]["config"]))
    config.update(overrides or {})
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers {layers}: give 1 or more")
        config["num_hidden_layers"] = layers
    return config


def _write_metadata(config: dict[str, Any], out: Path) -> None:
    tokenizer = resolve_model(TOKENIZER_MODEL)  # converted once from the packaged GGUF, then cached
    tok_dir, tok_config = tokenizer.path, tokenizer.config
    if config["vocab_size"] < tok_config["vocab_size"]:
        raise ValueError(f"vocab_size {config['vocab_size']} is below the tokenizer's {tok_config['vocab_size']}: "
                         "its ids would index past the embedding")
    ids = {k: tok_config[k] for k in ("bos_token_id", "eos_token_id")}  # EOS handling follows the tokenizer
    (out / "config.json").write_text(json.dumps({**config, **ids}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({**ids, "pad_token_id": ids["eos_token_id"]}, indent=2)
                                                + "\n")
    for name in TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copyfile(tok_dir / name, out / name)


def _write_weights(specs: list[TensorSpec], out: Path, seed: int, max_shard_bytes: int) -> None:
    shards = plan_shards(specs, max_shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1
             else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    weight_map = {}
    for fname, shard in zip(names, shards, strict=True):
        with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:  # normal_ runs on one core, GIL released
            tensors = dict(zip([s.name for s in shard], pool.map(lambda s: random_tensor(s, seed), shard), strict=True))
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({s.name: fname for s in shard})
        del tensors  # one shard in memory at a time
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_model(shape: str, out: str | Path, *, seed: int = 0, layers: int | None = None,
                overrides: dict[str, Any] | None = None, max_shard_bytes: int = SHARD_BYTES) -> MadeModel:
    """Write OUT (absent or empty) and say what it holds. The folder appears whole or not at all: it is
    written beside OUT and renamed, so an interrupted run leaves no half model for a benchmark to load."""
    t0 = time.perf_counter()
    config = shaped_config(shape, layers, overrides)
    specs = tensor_specs(config)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_metadata(config, staging)
        _write_weights(specs, staging, seed, max_shard_bytes)
        os.replace(staging, out)  # over an empty folder too (POSIX rename)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    nbytes = sum(s.nbytes for s in specs)
    return MadeModel(out, sorted(p.name for p in out.iterdir()), nbytes // 2, nbytes, time.perf_counter() - t0)


def _parse_set(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE with VALUE read as JSON when it parses (numbers, true, lists), else as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pageserve bench make-model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=list(SHAPES), help="a real checkpoint's shape (ops/bench/model_shapes.py)")
    p.add_argument("out", help="the folder to write (absent or empty)")
    p.add_argument("--seed", type=int, default=0, help="weights depend on (seed, tensor name) only (default 0)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="only N decoder layers: quick tests; no longer the real shape")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config.json field (repeatable; JSON values): tests only, no longer the real shape")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        made = write_model(args.shape, args.out, seed=args.seed, layers=args.layers, overrides=_parse_set(args.set))
    except ValueError as exc:
        print(f"pageserve bench make-model: {exc}", file=sys.stderr)
        return 2
    altered = " (--layers/--set: not the real shape)" if args.layers is not None or args.set else ""
    print(f"{args.shape}{altered} from {SHAPES[args.shape]['source']}: {made.parameters / 1e9:.3f} B parameters, "
          f"random bfloat16 (seed {args.seed}), tokenizer {TOKENIZER_MODEL}")
    for name in made.files:
        print(f"  {made.path / name}  {(made.path / name).stat().st_size / 1e6:,.1f} MB")
    print(f"{made.nbytes / 1e9:.2f} GB of weights in {made.seconds:.1f} s")
    return 0
