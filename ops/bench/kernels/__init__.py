"""Kernel benchmarks, run as modules (they print tables; none is a test):

    attention.py   GPU decode attention against the device's copy bandwidth (python -m ops.bench.kernels.attention)
    fused.py       the C layer ops against PyTorch on the CPU
    cpu_decode.py  the CPU decode attention kernel's loop variants (scalar, AVX2, AVX-512, ...) and the pick
    gemm.py        the panel GEMM against oneDNN and F.linear over a step's products
    ceiling.py     this CPU's FMA peak, product rates, bandwidth, and the offline workload's floor
"""
