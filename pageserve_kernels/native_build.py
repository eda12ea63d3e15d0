"""Compile a small C source once into a shared library in the pageserve cache folder.

The CPU kernels ship as C files in pageserve_kernels/csrc/ (package data: `<name>.c`, and
the `.h` files they include). Each is built on first use with the system C
compiler (`cc`, `-I pageserve_kernels/csrc`) and cached under a name keyed by a hash of
the source, every header in csrc/, the compiler, the flags and this CPU's
feature flags, so a changed kernel or header, or a different machine, rebuilds.
Without a compiler the caller gets an exception and keeps its PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pageserve_kernels import isa_cap
from pageserve_kernels.cpu_features import cpu_flags_line

log = logging.getLogger("pageserve.kernels")

# Not -ffast-math: linking a shared object with it pulls in crtfastmath.o, which turns on
# flush-to-zero for the whole process (torch, numpy and every test in it). These are the
# parts of it that let the compiler vectorize reductions.
FLAGS = (
    "-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
    "-fno-signed-zeros", "-freciprocal-math", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC",
)

# FLAGS minus those that would change results: FMA contraction, reassociation ((x * r) * w
# into x * (r * w)), x / y computed as x * (1 / y), and sign-of-zero shortcuts. For kernels
# whose every rounding step is written out (cpu_fused matches PyTorch bit for bit; cpu_gemm
# keeps one FMA chain per output in k order).
_UNSAFE = ("-ffp-contract=fast", "-fassociative-math", "-freciprocal-math", "-fno-signed-zeros")
EXACT_FLAGS = (*(f for f in FLAGS if f not in _UNSAFE), "-ffp-contract=off")


def enabled() -> bool:
    """PAGESERVE_NATIVE_KERNELS=0 keeps every PyTorch path (to compare, or where cc misbehaves)."""
    return os.environ.get("PAGESERVE_NATIVE_KERNELS", "1") != "0"


CSRC = Path(__file__).with_name("csrc")


def kernel_source(name: str) -> str:
    """The text of pageserve_kernels/csrc/<name>.c."""
    return (CSRC / f"{name}.c").read_text()


def try_load_kernel(name: str, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """try_load of pageserve_kernels/csrc/<name>.c."""
    return try_load(name, kernel_source(name), flags)


def try_load(name: str, source: str, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The compiled library, or None (with a warning) when disabled or no C compiler works here."""
    if not enabled():
        return None
    try:
        return load_library(name, source, flags)
    except (OSError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        log.warning("native %s kernels unavailable (%s); using the PyTorch path", name, exc)
        return None


def load_library(name: str, source: str, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    """The compiled library (built now if this source/compiler/CPU has no cached copy)."""
    return ctypes.CDLL(str(build(name, source, flags)))


def address(fn: ctypes._CFuncPtr) -> int:
    """A loaded C function's entry point, for C++ that calls the kernels (pageserve_kernels/csrc/llama_layers.cpp)."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def build(name: str, source: str, flags: tuple[str, ...] = FLAGS) -> Path:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc/gcc) on PATH")
    cap = isa_cap.active()  # PAGESERVE_CPU_ISA: -mno-* after -march=native, a build of its own
    return cached_build(f"{name}.c", source, (compiler, *flags, *(cap.compiler_flags if cap else ()), f"-I{CSRC}"),
                        ("-lm",))


def cached_build(file_name: str, source: str, command: tuple[str, ...], libs: tuple[str, ...],
                 key_extra: tuple[str, ...] = ()) -> Path:
    """`command -o lib.so file_name libs`, once per source, header, command and CPU (pageserve_kernels/torch_ops.py
    builds C++ through it too)."""
    headers = [h.read_text() for h in sorted(CSRC.glob("*.h"))]
    key_parts = [source, *headers, *command, *libs, *key_extra, cpu_flags_line()]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    from shared.model_store import cache_dir

    stem = file_name.rsplit(".", 1)[0]
    target = cache_dir() / "kernels" / f"{stem}-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / file_name
        src.write_text(source)
        lib = Path(tmp) / target.name
        subprocess.run([*command, "-o", str(lib), str(src), *libs], check=True, capture_output=True)
        os.replace(lib, target)  # atomic: concurrent first starts each build, one wins
    return target
