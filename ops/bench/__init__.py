"""`pageserve bench NAME`: benchmarks print tables (and can write JSON); they are not tests."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "offline": "ops.bench.offline",
    "priority": "ops.bench.priority",
    "admission": "ops.bench.admission",
    "streaming": "ops.bench.streaming",
    "soak": "ops.bench.soak",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: pageserve bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)
