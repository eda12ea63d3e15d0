"""A LoRA adapter's file bytes into pageserve_kernels/cpu_lora.py's layouts in one C call (csrc/lora_pack.c).

    file bytes (float32 | bfloat16 | float16, as stored)  --one call, GIL released-->  one buffer of the
    serving dtype: every stacked A in pack_a's blocks, every B (scale folded in, in float32) in its panels

Why C: laid out by PyTorch, a 50 MB adapter is ~420 tensors each through a dozen small ops, each holding
the GIL (the step loop's Python waits for it) and waking torch's intra-op threads (which compete with the
step's own): 150+ ms of the load and +70% on the running streams' p99 inter-token latency. The C call holds
no GIL (ctypes releases it), uses one core (no OpenMP) and writes each byte once.

This file only moves bytes: engine/worker/lora/adapter.py reads the header, checks every shape and rank,
and plans the jobs (JOB_FIELDS int64s each, csrc/lora_pack.c's field order). `cpu_lora.pack_a` and
`cpu_gemm.pack_panels` stay the reference the layout is tested against bit for bit, and the path where
this kernel does not load (no C compiler, PAGESERVE_NATIVE_KERNELS=0).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pageserve_kernels import native_build

JOB_FIELDS = 9
"""int64s per job: KIND, SRC, SRC_DT, ROWS, COLS, DST, ROW0, TOTAL, SCALE (csrc/lora_pack.c)."""
KIND_A, KIND_B = 0, 1
SOURCE_DTYPES = {"F32": 0, "BF16": 1, "F16": 2}
"""safetensors' dtype names this kernel reads, and its codes for them."""
SERVING_DTYPES = (torch.float32, torch.bfloat16)
ALIGN = 64
"""Byte alignment of every packed A and panel in the destination (the kernels' aligned vector loads)."""


class LoraPacker:
    """ctypes binding of csrc/lora_pack.c."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fn = lib.lora_pack
        self._fn.restype, self._fn.argtypes = i, [p, i, p, i, ctypes.c_int, p, i]

    def pack(self, source: torch.Tensor, out: torch.Tensor, jobs: torch.Tensor) -> None:
        """Runs every job (jobs (n, JOB_FIELDS) int64) from the file's bytes (source (size,) uint8) into out
        (1-D, the serving dtype)."""
        assert source.dtype == torch.uint8 and source.dim() == 1 and source.is_contiguous()
        assert out.dtype in SERVING_DTYPES and out.dim() == 1 and out.is_contiguous() and out.device.type == "cpu"
        assert jobs.dtype == torch.int64 and jobs.is_contiguous() and jobs.shape[1:] == (JOB_FIELDS,)
        assert out.data_ptr() % ALIGN == 0
        failed = self._fn(source.data_ptr(), source.numel(), out.data_ptr(), out.nbytes,
                          int(out.dtype == torch.bfloat16), jobs.data_ptr(), jobs.shape[0])
        if failed == -1:
            raise MemoryError("lora_pack: no memory for its scratch row")
        assert failed == 0, f"lora_pack: job {failed - 1} {jobs[failed - 1].tolist()} falls outside its buffers"


@functools.cache
def load() -> LoraPacker | None:
    """The compiled packer, or None: disabled or no C compiler works (adapter.py then packs with PyTorch)."""
    single = tuple(f for f in native_build.EXACT_FLAGS if f != "-fopenmp")  # one core: see the module docstring
    lib = native_build.try_load_kernel("lora_pack", single)
    return None if lib is None else LoraPacker(lib)
