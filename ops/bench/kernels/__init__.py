"""Kernel benchmarks, run as modules (they print tables; none is a test):

    attention.py   GPU decode attention against the device's copy bandwidth (python -m ops.bench.kernels.attention)
    lora.py        GPU LoRA: the Triton shrink + expand against the per-adapter PyTorch path (python -m ops.bench.kernels.lora)
    fused.py       the C layer ops against PyTorch on the CPU
    cpu_decode.py  the CPU decode attention kernel's loop variants (scalar, AVX2, AVX-512, ...) and the pick
    cpu_prefill.py CPU prompt attention: the C kernel against PyTorch's SDPA on any chunk mix, and the pick
    gemm.py        the panel GEMM against oneDNN and F.linear over a step's products
    ceiling.py     this CPU's FMA peak, product rates, bandwidth, and the offline workload's floor
"""

from __future__ import annotations

import argparse


def add_head_shape(parser: argparse.ArgumentParser) -> None:
    """--heads, --kv-heads and --head-dim, SmolLM2-135M's attention shape (9 query heads over 3 KV heads of
    64) by default: the shape the CPU benches time unless told otherwise."""
    parser.add_argument("--heads", type=int, default=9, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
