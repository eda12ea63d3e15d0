"""One table of every system in a same-run comparison: figures, and pageserve's ratio to each.

The first row of each prefix-caching setting is its reference (pageserve); a system without figures keeps its
row and says why (not given, failed), so a missing peer is never silently
skipped. Rendering only: the numbers come from the commands that measured them.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from ops.bench.vllm_peer import PeerResult


def peer_table(rows: list[PeerResult], title: str) -> Table:
    table = Table(title=title)
    for col in ("system", "seconds", "output tok/s", "pageserve / this"):
        table.add_column(col, justify="left" if col == "system" else "right")
    references: dict[bool, float | None] = {}
    for r in rows:
        references.setdefault(r.prefix_caching, r.tok_s)
    for r in rows:
        reference = references[r.prefix_caching]
        if r.tok_s is None or r.seconds is None:
            table.add_row(r.name, "-", "-", r.error or "no figures")
            continue
        ratio = f"{reference / r.tok_s:.2f}x" if reference else "-"
        table.add_row(r.name, f"{r.seconds:.1f}", f"{r.tok_s:.1f}", ratio)
    return table


def print_peer_table(rows: list[PeerResult], title: str, console: Console | None = None) -> None:
    (console or Console(width=None if sys.stdout.isatty() else 200)).print(peer_table(rows, title))
