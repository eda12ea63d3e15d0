"""Run as a host with fewer instructions than this one: PAGESERVE_CPU_ISA=avx2 on an AVX-512 or AMX machine.

This project's hosts differ in their processor (AVX2 only, AVX-512 with AVX512-BF16, AMX), and a
developer rarely has each kind at hand. The cap lets one machine take the paths an AVX2-only host
takes, for our engine and for a peer in the same run (`pageserve bench offline --vllm-python`):

  - cpu_features hides the wider flags, so `--dtype auto`, the bfloat16 kernels' presence and the
    per-host choices' cache key (choice.host_key) follow from the capped flags;
  - the C kernels compile with -mno-avx512f -mno-amx-tile after -march=native (a build of its own);
  - torch, oneDNN and MKL read their own switches (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA,
    MKL_ENABLE_INSTRUCTIONS) once, at their first operation: `pageserve` sets them before it
    imports anything else (ops/cli.py), and child processes (the engine, vLLM) inherit them;
  - vLLM's worker (ops/bench/vllm_worker.py) answers its torch.cpu checks for AVX-512 and AMX with
    False, so it loads its AVX2 build of its kernels.

It is not the other host: caches, memory bandwidth and clocks stay this machine's, so a ratio
measured under the cap says which code is faster, not what an AVX2 machine would measure.
This module imports nothing heavy (ops/cli.py calls it before torch is loaded), so it also reads
/proc/cpuinfo for every caller, and says which host a benchmark's numbers came from.
"""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

ISA_ENV = "PAGESERVE_CPU_ISA"
# the flags that choose among our kernels and torch's, in the order host_summary prints them
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class IsaCap:
    hidden_flag_prefixes: tuple[str, ...]
    """/proc/cpuinfo flags the capped host does not have (by prefix)."""
    compiler_flags: tuple[str, ...]
    """Added after -march=native: the compiler emits none of the hidden instructions."""
    library_env: dict[str, str] = field(default_factory=dict)
    """The switches torch (ATen), oneDNN and MKL read for their own dispatch."""


CAPS = {
    "avx2": IsaCap(
        hidden_flag_prefixes=("avx512", "amx"),
        compiler_flags=("-mno-avx512f", "-mno-amx-tile"),  # each also turns off the extensions built on it
        library_env={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    ),
}


def active(environ: MutableMapping[str, str] | None = None) -> IsaCap | None:
    """The cap PAGESERVE_CPU_ISA names, None when unset ("native" too); an unknown name is an error."""
    name = (os.environ if environ is None else environ).get(ISA_ENV, "").strip().lower()
    if name in ("", "native"):
        return None
    if name not in CAPS:
        raise ValueError(f"{ISA_ENV}={name!r}: known caps are {', '.join(['native', *CAPS])}")
    return CAPS[name]


def visible_flags(flags_line: str, cap: IsaCap | None) -> str:
    """A /proc/cpuinfo `flags` line without the flags the cap hides (unchanged when no cap)."""
    if cap is None or not flags_line:
        return flags_line
    head, colon, flags = flags_line.partition(":")
    kept = [f for f in flags.split() if not f.startswith(cap.hidden_flag_prefixes)]
    return f"{head}{colon} {' '.join(kept)}\n"


def apply_library_env(environ: MutableMapping[str, str] | None = None) -> IsaCap | None:
    """Sets the cap's switches for torch, oneDNN and MKL (values already set win); the cap, if any."""
    env = os.environ if environ is None else environ
    cap = active(env)
    for name, value in (cap.library_env if cap else {}).items():
        env.setdefault(name, value)
    return cap


def visible_flags_line() -> str:
    """This host's `flags` line less what PAGESERVE_CPU_ISA hides: what every path here decides by."""
    return visible_flags(proc_flags_line(), active())


@functools.cache
def proc_flags_line() -> str:
    """The first `flags` line of /proc/cpuinfo as the kernel reports it, or "" where there is none."""
    return _cpuinfo_line("flags")


@functools.cache
def cpu_model() -> str:
    return _cpuinfo_line("model name").partition(":")[2].strip()


def _cpuinfo_line(key: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(key)), "")
    except OSError:
        return ""


def host_summary() -> str:
    """The CPU model and the vector flags our paths follow (after any cap), for benchmark headers."""
    flags = visible_flags_line().partition(":")[2].split()
    vector = " ".join(f for f in VECTOR_FLAGS if f in flags) or "no vector flags read"
    capped = f" (capped: {ISA_ENV}={os.environ[ISA_ENV]})" if active() else ""
    return f"{cpu_model() or 'unknown CPU'}, {vector}{capped}"
