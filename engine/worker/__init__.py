"""The worker part: executes a scheduled step on the device. Only this part (with the kernels) touches tensors.

    model_runner.py     ModelRunner.execute(SchedulerOutput) -> RunnerOutput: move blocks, inputs, forward, sample
    input_batch.py      one step as flat tensors: token ids, positions, slot mapping, block tables
    kv_cache.py         the device KV pool that attention reads and the CPU pool that swaps go to
    sampler.py          next-token choice per row: greedy, temperature, top-k, top-p, seeds
    prompt_logprobs.py  prompt tokens' logprobs from the prompt's own step, gathered across chunks
    structured_outputs.py  grammars (xgrammar) -> each constrained row's allowed tokens, before sampling
    utf8_guard.py       ... narrowed to tokens that keep the row's bytes well-formed UTF-8
    host_allocator.py   glibc malloc kept from unmapping a step's large temporaries (set once per process);
                        the CPU KV pool on transparent huge pages
    model_loader.py     weights from a Hugging Face folder (safetensors) into our DecoderModel, by the weight-name map
    models/             the one decoder every architecture runs (decoder.py), its options record (spec.py) and
                        one config reader + weight-name map per architecture family (architectures/)
    native_layers.py    CPU steps through the same layers in one C++ call (pageserve_kernels/csrc/llama_layers.cpp):
                        the same kernels, bit for bit the Python forward's results, without its glue
    decode_graphs.py    CUDA graphs for decode-only steps (the GPU's counterpart)
    layers/             attention (paged, through pageserve_kernels), linear, MLP, norm, rotary
    lora/               LoRA adapters: PEFT folders onto our fused projections, the registry of loads, the
                        step's rows grouped by adapter (each projection adds x A^T B^T per group)
    parallel/           tensor parallelism (--tensor-parallel-size): the split, sharded weights, parallel
                        layers, the gloo group, rank 0's leader and the worker processes
"""
