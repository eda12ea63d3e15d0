"""Attention, KV-cache and layer kernels: Triton for GPUs, PyTorch and C for CPUs, one reference for both.

    reference.py        slow, obviously correct PyTorch: the definition every path is tested against
    cpu_attention.py    the fast PyTorch path (the engine's CPU backend)
    cpu_fused.py        C: add + RMSNorm, SiLU-and-mul, rotary, argmax for the float32 CPU forward pass
    fused_ops.py        those ops for the layers: the C kernel where it applies, else the PyTorch reference
    paged_attention.py  Triton: varlen paged attention (decode, prefill chunks, mixed), GQA, split-K
    merge_splits.py     Triton: reduces paged attention's split-K partial results
    write_kv.py         Triton: new keys/values into their cache slots
    copy_blocks.py      Triton: copy-on-write block copies, every layer in one launch
    swap_blocks.py      PyTorch: device <-> CPU pool swaps, one transfer per step
    dispatch.py         select_backend("auto" | "torch" | "triton", device) -> AttentionBackend
    bench.py            GPU decode-attention benchmark (python -m kernels.bench)
    bench_fused.py      the C layer ops against PyTorch on the CPU (python -m kernels.bench_fused)
    aot.py              compile every Triton kernel for sm_90 without a GPU (python -m kernels.aot)

Importing this package imports no Triton module: the CPU engine never needs one.
"""
