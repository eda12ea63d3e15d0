"""Counting Triton compilations in this process, across Triton versions (3.6 as well as ours).

Newer Triton calls `triton.knobs.runtime.jit_post_compile_hook` after every
in-process compilation; without knobs, the kernels' own caches are counted.
Under the interpreter nothing compiles and the count is None.
"""

from __future__ import annotations

from typing import Any

KERNELS = (
    "pageserve_kernels.paged_attention:_paged_attention_kernel",
    "pageserve_kernels.merge_splits:_merge_splits_kernel",
    "pageserve_kernels.write_kv:_write_kv_kernel",
    "pageserve_kernels.copy_blocks:_copy_blocks_kernel",
)


def _jit_functions() -> list[Any]:
    import importlib

    out = []
    for spec in KERNELS:
        module, name = spec.split(":")
        out.append(getattr(importlib.import_module(module), name))
    return out


def _cached_binaries() -> int:
    total = 0
    for fn in _jit_functions():
        for cache in getattr(fn, "device_caches", {}).values():
            total += len(cache[0])
    return total


class CompileCounter:
    """Compilations since construction."""

    def __init__(self) -> None:
        from pageserve_kernels.checks import interpreting

        self._interpreting = interpreting()
        self._hooked = 0
        self._start = _cached_binaries() if not self._interpreting else 0
        self._uses_hook = False
        try:
            from triton import knobs

            previous = knobs.runtime.jit_post_compile_hook

            def hook(*args: Any, **kwargs: Any) -> Any:
                self._hooked += 1
                return previous(*args, **kwargs) if previous else None

            knobs.runtime.jit_post_compile_hook = hook
            self._uses_hook = True
        except (ImportError, AttributeError):
            pass

    def count(self) -> int | None:
        if self._interpreting:
            return None
        return self._hooked if self._uses_hook else _cached_binaries() - self._start
