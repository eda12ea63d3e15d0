"""The prepared GPU check (python -m ops.gpu_check): is the CUDA path ready, in one run.

    __main__.py         the sections, their order and the PASS/FAIL summary
    engine_checks.py    the engine on the device: parity with the CPU path, graphs, sampling, sweep, profile
    kernel_timing.py    decode attention against copy bandwidth, 4 vs 8 warps for a long prefill
    triton_counters.py  how many Triton compilations happened (across Triton versions)
    random_model.py     a random-weight Llama folder written without transformers (bare GPU images)

Imports engine/ and pageserve_kernels/; nothing imports it.
"""
