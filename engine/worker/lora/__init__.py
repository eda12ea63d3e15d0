"""LoRA adapters on the one base model: many fine-tunes served side by side, in one batch.

    adapter.py    a PEFT folder -> LoraAdapter: per layer and fused projection, A stacked for one
                  shrink product and each target's B (scale folded in) over its output slice;
                  checked against the base model's shapes, a LoraError (a 400) naming the problem;
                  one layout per adapter: the CPU kernel's packed form, or the plain tensors
    safetensors_file.py  the file read whole (O_DIRECT, GIL released) and its header: each tensor's dtype,
                  shape, offset
    prefaulted_pages.py  the packed buffer's pages, mapped and faulted in on a thread while the disk reads
    packed_layout.py  where a checked adapter's packed tensors lie in its one buffer (an mmap of its own),
                  filled by one C call from the file's bytes (pageserve_kernels/lora_pack.py)
    registry.py   adapter names -> loads (each load a new, never reused id: the prefix cache's key),
                  unload while requests still run, the --max-cpu-loras host cache
    reader.py     the one thread reading adapter folders off the step loop (admin loads, evicted adapters)
    evicted_reads.py  a request naming an evicted adapter waits while its folder is read again
    batch.py      one step's rows grouped by adapter; each projection adds x[rows] A^T B^T per group: one
                  C kernel call for all groups on the CPU (pageserve_kernels/cpu_lora.py; the same call the
                  C++ layer loop makes, so adapter steps stay on it), Triton on CUDA, else PyTorch's products
    warmup.py     on CUDA: every shrink/expand variant a step can launch, compiled at start-up
    device_weights.py  on CUDA: the active adapters stacked into weight slots and the step's rows as
                  one index list, for the Triton shrink/expand kernels (two launches per projection)

The scheduler sees only a request's adapter id (engine/scheduling/lora_gate.py); the layers see
only a LoraBatch. A step without adapter rows builds no LoraBatch and pays nothing.
"""
