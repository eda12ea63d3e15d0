"""Attention, KV-cache and layer kernels: Triton for GPUs, PyTorch and C for CPUs, one reference for both.

    reference.py        slow, obviously correct PyTorch: the definition every path is tested against
    cpu_attention.py    the fast CPU path (the engine's CPU backend): plans a step, calls the C kernels or SDPA
    cpu_decode.py       C: decode attention over the paged cache, float32 and bfloat16 (scalar, AVX2, AVX-512,
                        AVX512-BF16 loops; the fastest this host runs picked by choice.py)
    cpu_prefill.py      C: causal attention of every prompt chunk of a step over the paged cache, float32/bfloat16
                        (bfloat16 products on AMX tiles where the host has them: csrc/prefill_amx.h)
    cpu_gemm.py         C: products over prepacked weight panels, float32 (AVX2) and bfloat16 (AVX512-BF16, and
                        on AMX tiles over the same panels), candidates engine/worker/layers/linear.py times per row bucket
    cpu_lora.py         C: LoRA's shrink and expand products for every adapter group of a step, float32 (AVX2)
                        and bfloat16 (AVX512-BF16), one call per projection (Python layers and the C++ loop alike)
    cpu_fused.py        C: add + RMSNorm, SiLU-and-mul, rotary, argmax, KV row copies for the float32 CPU forward pass
    cpu_fused_bf16.py   C (omp simd, vectorised for the host): add + RMSNorm, SiLU-and-mul, rotary, exact logits
                        (the vocab product's near-maximum in float32) in bfloat16
    choice.py           times candidate implementations once per host, caches and logs the fastest
    host_load.py        how many cores other processes took while we timed (busy timings are measured again)
    fused_choice.py     C kernel or PyTorch for each fused op, dtype and width, by choice.py
    prefill_choice.py   the C prefill kernel or PyTorch's SDPA for prompt chunks, per dtype and head shape, by choice.py
    csrc/               the C sources of those kernels (package data; exp8_avx2.h, exp16_avx512.h, bf16_elem.h,
                        values_avx512.h (P . V tiles), attend_tiles.h (keys by slot, Q . K^T, online softmax) and
                        amx_tiles.h (AMX permission, tile configuration) shared; decode_vec.h, decode_avx512.h and
                        shared_prefix.h the decode kernel's loops; prefill_amx.h the prompt kernel's AMX products;
                        lora_entry.h the LoRA kernels' entry table),
                        and llama_layers.cpp (a torch operator class that runs a Llama step's layers over those
                        kernels: engine/worker/native_layers.py)
    native_build.py     compiles and caches the C kernels; PAGESERVE_NATIVE_KERNELS=0 turns them off
    torch_ops.py        compiles and caches C++ torch operators (csrc/*.cpp) against the installed torch
    cpu_features.py     what this CPU computes natively (AVX2, FMA, AVX512-BF16, AMX) from /proc/cpuinfo
    isa_cap.py          /proc/cpuinfo's model and flags, and PAGESERVE_CPU_ISA=avx2: an AVX-512 or AMX host takes
                        an AVX2-only host's paths (flags, C builds, torch/oneDNN/MKL switches; vLLM's too)
    fused_ops.py        those ops for the layers: the C kernel where it applies, else the PyTorch reference
    paged_attention.py  Triton: varlen paged attention (decode, prefill chunks, mixed), GQA, split-K
    merge_splits.py     Triton: reduces paged attention's split-K partial results
    write_kv.py         Triton: new keys/values into their cache slots
    copy_blocks.py      Triton: copy-on-write block copies, every layer in one launch
    lora_shrink.py      Triton: LoRA shrink, s = x[rows] A[slot]^T for every adapter group of a step in one launch
    lora_expand.py      Triton: LoRA expand, out[rows, slice] += s B[slot, slice]^T in place, all groups and
                        fused slices (q/k/v, gate/up) in one launch; lora_rows.py their row-group layout
    block_moves.py      the engine's one path for KV block moves: copy-on-write (the backend's
                        copy_blocks), swaps with a pinned pool on a side stream on GPUs
    warmup.py           every Triton variant an engine can request, compiled at start-up
    dispatch.py         select_backend("auto" | "torch" | "triton", device) -> AttentionBackend

Importing this package imports no Triton module: the CPU engine never needs one. Nothing here imports
engine/, gateway/ or ops/ (tests/test_architecture.py): the kernels' benchmarks live in ops/bench/kernels/
and the ahead-of-time compile check in ops/kernels_aot.py.

(Named pageserve_kernels, not kernels: Hugging Face's `kernels` distribution, which transformers
requires, owns that import name.)
"""
