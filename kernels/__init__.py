"""Attention and KV-cache kernels: Triton for GPUs, PyTorch for CPUs, one reference for both.

    reference.py        slow, obviously correct PyTorch: the definition every path is tested against
    cpu_attention.py    the fast PyTorch path (the engine's CPU backend)
    paged_attention.py  Triton: varlen paged attention (decode, prefill chunks, mixed), GQA, split-K
    merge_splits.py     Triton: reduces paged attention's split-K partial results
    write_kv.py         Triton: new keys/values into their cache slots
    copy_blocks.py      Triton: copy-on-write block copies, every layer in one launch
    swap_blocks.py      PyTorch: device <-> CPU pool swaps, one transfer per step
    dispatch.py         select_backend("auto" | "torch" | "triton", device) -> AttentionBackend
    bench.py            GPU decode-attention benchmark (python -m kernels.bench)
    aot.py              compile every Triton kernel for sm_90 without a GPU (python -m kernels.aot)

Importing this package imports no Triton module: the CPU engine never needs one.
"""
