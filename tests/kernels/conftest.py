"""Kernel tests run the Triton kernels in the interpreter on the CPU.

Triton reads TRITON_INTERPRET when a kernel is decorated (module import), so the
variable is set here, before any test module imports kernels.*; a kernel module
that some earlier test imported in compiled mode is reloaded.

On a GPU machine, the compiled kernels are tested with
    TRITON_INTERPRET=0 pytest tests/kernels -m gpu
(an explicit value is kept; tests marked gpu need CUDA and no interpreter).
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

_KERNEL_MODULES = (
    "pageserve_kernels.checks",
    "pageserve_kernels.bf16",
    "pageserve_kernels.merge_splits",
    "pageserve_kernels.paged_attention",
    "pageserve_kernels.write_kv",
    "pageserve_kernels.copy_blocks",
    "pageserve_kernels.lora_rows",
    "pageserve_kernels.lora_shrink",
    "pageserve_kernels.lora_expand",
)


def _reload_compiled_kernels() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    stale = False
    for name in _KERNEL_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        # every @triton.jit function, helpers too (bf16's store_cast, paged attention's tile loop)
        jitted = [v for v in vars(module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
        stale = stale or any(not isinstance(k, InterpretedFunction) for k in jitted)
        if stale:  # dependants hold references to their imports: reload in dependency order
            importlib.reload(module)


_reload_compiled_kernels()
