"""How much memory this process may still take: what optional copies of the weights are weighed against.

MemAvailable from /proc/meminfo (the kernel's estimate of what can be allocated without swapping, page
cache it can drop included), lowered to the room left under the cgroup's memory.max where the engine runs
under a limit (systemd's MemoryMax, which `pageserve admin install-units --memory-max` sets; a container's).
None where neither can be read (not Linux). Knows nothing about models.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

STEP_HEADROOM = 2 << 30
"""Bytes kept free beyond the KV pools for what a running engine allocates after its weights: the step
temporaries malloc keeps (engine/worker/host_allocator.py, up to 1 GiB), prompt activations, grammars,
adapters, the tokenizer."""


def available_bytes(root: Path = Path("/")) -> int | None:
    """Bytes this process can still allocate (the smaller of the host's and its cgroup's room), or None."""
    values = [v for v in (_mem_available(root), _cgroup_room(root)) if v is not None]
    return min(values) if values else None


def _mem_available(root: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_room(root: Path) -> int | None:
    """memory.max - memory.current of this process's cgroup (v2); None without a limit."""
    with contextlib.suppress(OSError, ValueError):
        for line in (root / "proc/self/cgroup").read_text().splitlines():
            hierarchy, _, path = line.partition("::")
            if hierarchy == "0":
                group = root / "sys/fs/cgroup" / path.lstrip("/")
                limit = (group / "memory.max").read_text().strip()
                if limit == "max":
                    return None
                return int(limit) - int((group / "memory.current").read_text())
    return None
