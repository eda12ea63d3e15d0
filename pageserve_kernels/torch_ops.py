"""C++ sources that register torch operators (`TORCH_LIBRARY`), compiled once and loaded into `torch.ops`.

For code that must call torch itself, which the ctypes C kernels cannot: today the decode layer
stack (pageserve_kernels/csrc/llama_layers.cpp, whose products go through oneDNN's packed weights).
Built with the system C++ compiler against the installed torch's headers and libraries
(`torch.utils.cpp_extension`'s paths) and cached like the C kernels (pageserve_kernels/native_build.py:
keyed by source, compiler, flags, CPU and torch version). Without a compiler, or with
PAGESERVE_NATIVE_KERNELS=0, `load` returns False and callers keep their Python path.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess

import torch
from torch.utils import cpp_extension

from pageserve_kernels import native_build

log = logging.getLogger("pageserve.kernels")

FLAGS = ("-O2", "-std=c++20", "-shared", "-fPIC", "-w")  # -w: torch's headers warn by the hundred


@functools.cache
def load(name: str) -> bool:
    """Whether pageserve_kernels/csrc/<name>.cpp is built and its operators registered in this process."""
    if not native_build.enabled():
        return False
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    try:
        if compiler is None:
            raise FileNotFoundError("no C++ compiler (c++/g++) on PATH")
        abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
        command = (compiler, *FLAGS, abi, *(f"-I{p}" for p in cpp_extension.include_paths()))
        lib_dirs = cpp_extension.library_paths()
        libs = (*(f"-L{p}" for p in lib_dirs), *(f"-Wl,-rpath,{p}" for p in lib_dirs), "-ltorch_cpu", "-lc10")
        source = (native_build.CSRC / f"{name}.cpp").read_text()
        path = native_build.cached_build(f"{name}.cpp", source, command, libs, (torch.__version__,))
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.decode(errors="replace")[-2000:] if isinstance(exc, subprocess.CalledProcessError) else exc
        log.warning("torch operators %s unavailable (%s); using the Python path", name, detail)
        return False
    return True
