"""The `pageserve` console script: one entry, a subcommand per component.

Each subcommand lives in its own module exposing `main(argv) -> int`; it is
imported only when used, so `pageserve admin` never pays for torch.
"""

from __future__ import annotations

import importlib
import sys

from pageserve_kernels.isa_cap import apply_library_env

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "engine": ("engine.serving.main", "run the engine process (owns the model and the KV cache)"),
    "gateway": ("gateway.server", "run the OpenAI-compatible HTTP gateway"),
    "up": ("ops.launcher", "start redis, engine and gateway locally and print a demo key"),
    "admin": ("ops.admin", "manage tenants, keys, quotas and usage in Redis"),
    "bench": ("ops.bench", "benchmarks: offline, serve, memory, priority, admission, streaming, soak, replicas, sampler, agreement, step-overhead, make-model, lora-load"),
    "generate": ("ops.generate", "offline generation from the command line"),
    "curve-keys": ("shared.curve", "write ZeroMQ CURVE key files for the engine socket"),
}


def usage() -> str:
    lines = ["usage: pageserve <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"pageserve: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        apply_library_env()  # PAGESERVE_CPU_ISA: torch, oneDNN and MKL read their switches at their first operation
    except ValueError as exc:
        print(f"pageserve: {exc}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
