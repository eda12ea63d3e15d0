"""`bench serve` output: the rich table, the JSON file with every request's timings, and `--plot` PNGs.

A `RunResult` is one system at one load (rate or concurrency) on one workload;
rendering never measures. Plots import matplotlib (Agg) only when asked for.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ops.bench.serve_stats import RequestTiming, Slo, Summary, summarize, token_shares


@dataclass(frozen=True)
class RunResult:
    system: str
    load: str
    """"rate 2/s", "all at once", "concurrency 8" ..."""
    workload: str
    timings: list[RequestTiming]
    duration_s: float
    slo: Slo
    error: str | None = None
    """Why this system has no figures (a peer not given or not started)."""
    summary: Summary = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", summarize(self.timings, self.duration_s, self.slo))

    def tenant_summaries(self) -> dict[str, Summary]:
        tenants = sorted({t.tenant for t in self.timings})
        return {k: summarize([t for t in self.timings if t.tenant == k], self.duration_s, self.slo) for k in tenants}


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{1000 * x:.0f}"


def results_table(results: list[RunResult], title: str) -> Table:
    table = Table(title=title)
    cols = ["system", "load", "done", "req/s", "out tok/s", "TTFT p50/p90/p99 ms", "ITL p50/p90/p99 ms",
            "TPOT p50 ms", "e2e p50/p99 s", "goodput req/s", "errors"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("system", "load", "errors") else "right")
    for r in results:
        s = r.summary
        if r.error:
            table.add_row(r.system, r.load, "-", "-", "-", "-", "-", "-", "-", "-", r.error)
            continue
        errors = ", ".join(f"{k}: {v}" for k, v in s.errors.items()) or "none"
        table.add_row(r.system, r.load, f"{s.completed}/{s.requests}", f"{s.request_rate:.2f}", f"{s.output_tok_s:.1f}",
                      "/".join(_ms(s.ttft[p]) for p in ("p50", "p90", "p99")),
                      "/".join(_ms(s.itl[p]) for p in ("p50", "p90", "p99")), _ms(s.tpot["p50"]),
                      f"{s.e2e['p50']:.2f}/{s.e2e['p99']:.2f}", f"{s.goodput:.2f}", errors)
    return table


VERSUS: tuple[tuple[str, str, bool], ...] = (
    ("out tok/s", "output_tok_s", True), ("TTFT p50 ms", "ttft.p50", False), ("TTFT p99 ms", "ttft.p99", False),
    ("TPOT p50 ms", "tpot.p50", False), ("ITL p99 ms", "itl.p99", False), ("goodput req/s", "goodput", True))
"""The figures issue 41 compares with vLLM at each rate: (column, Summary field, whether higher is better)."""
SMOOTH_RATIO = 3.0
"""Closed-loop streams keep p99 inter-token latency within this many times the median (issue 41)."""


def closed_loop_label(streams: int) -> str:
    return f"closed loop, {streams} streams"


def figure(s: Summary, field_name: str) -> float:
    name, _, pct = field_name.partition(".")
    value = getattr(s, name)
    return float(value[pct] if pct else value)


def versus_table(results: list[RunResult], ours: str = "pageserve", peer: str = "vLLM serve") -> Table | None:
    """Ours / the peer's at each load both ran, each cell marked ok where ours is at least as good."""
    runs = {(r.system, r.load): r.summary for r in results if not r.error}
    loads = [load for load in dict.fromkeys(r.load for r in results) if (ours, load) in runs and (peer, load) in runs]
    if not loads:
        return None
    table = Table(title=f"{ours} / {peer}, same run (ok: at least as good)")
    table.add_column("load")
    for column, _, _ in VERSUS:
        table.add_column(column, justify="right")
    for load in loads:
        cells = []
        for _, field_name, higher in VERSUS:
            a, b = figure(runs[(ours, load)], field_name), figure(runs[(peer, load)], field_name)
            scale = 1.0 if higher else 1000.0
            good = a >= b if higher else a <= b
            cells.append(f"{scale * a:.{1 if higher else 0}f} / {scale * b:.{1 if higher else 0}f} "
                         f"{'ok' if good else 'WORSE'}")
        table.add_row(load, *cells)
    return table


def print_versus(results: list[RunResult], console: Console | None = None) -> None:
    table = versus_table(results)
    if table is not None:
        (console or Console()).print(table)


def smoothness_lines(results: list[RunResult]) -> list[str]:
    """p99 ITL over the median of each closed-loop run."""
    lines = []
    for r in results:
        if r.error or not r.load.startswith("closed loop") or not r.summary.completed:
            continue
        p50, p99 = r.summary.itl["p50"], r.summary.itl["p99"]
        ratio = p99 / p50 if p50 > 0 else math.inf
        lines.append(f"{r.system}, {r.load}: p99 ITL {1000 * p99:.0f} ms / median {1000 * p50:.0f} ms = "
                     f"{ratio:.2f}x ({'within' if ratio <= SMOOTH_RATIO else 'PAST'} {SMOOTH_RATIO:g}x)")
    return lines


def tenant_table(result: RunResult, alone: RunResult | None) -> Table:
    table = Table(title=f"{result.system}, {result.load}: per tenant")
    for c in ("tenant", "done", "token share", "TTFT p50 ms", "TTFT p99 ms", "p99 TTFT alone ms", "with / alone"):
        table.add_column(c, justify="left" if c == "tenant" else "right")
    shares = token_shares(result.timings)
    alone_s = alone.tenant_summaries() if alone else {}
    for tenant, s in result.tenant_summaries().items():
        solo = alone_s.get(tenant)
        ratio = f"{s.ttft['p99'] / solo.ttft['p99']:.2f}x" if solo and solo.completed else "-"
        table.add_row(tenant, f"{s.completed}/{s.requests}", f"{100 * shares.get(tenant, 0):.1f}%", _ms(s.ttft["p50"]),
                      _ms(s.ttft["p99"]), _ms(solo.ttft["p99"]) if solo else "-", ratio)
    return table


def print_results(results: list[RunResult], title: str, console: Console | None = None) -> None:
    (console or Console()).print(results_table(results, title))


def to_json(results: list[RunResult], meta: dict[str, Any]) -> dict[str, Any]:
    runs = []
    for r in results:
        s = r.summary
        runs.append({"system": r.system, "load": r.load, "workload": r.workload, "error": r.error,
                     "summary": {**asdict(s), "request_rate": s.request_rate, "output_tok_s": s.output_tok_s,
                                 "total_tok_s": s.total_tok_s, "goodput": s.goodput},
                     "slo": asdict(r.slo), "token_shares": token_shares(r.timings),
                     "requests": [asdict(t) for t in r.timings]})
    return {"meta": meta, "runs": runs}


def write_json(path: str, results: list[RunResult], meta: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(_finite(to_json(results, meta)), indent=1, allow_nan=False))


def _finite(x: Any) -> Any:
    """NaN (a percentile of no values) becomes null: strict JSON readers reject NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def plot(results: list[RunResult], folder: str, name: str) -> list[Path]:
    """Latency CDFs (TTFT, ITL) per run, and TTFT over each request's send time; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    ran = [r for r in results if not r.error and r.summary.completed]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in ran:
        for ax, values in ((axes[0], [t.ttft for t in r.timings if t.ok]),
                           (axes[1], [g for t in r.timings if t.ok for g in t.itl])):
            xs = sorted(1000 * v for v in values if v is not None)
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{r.system}, {r.load}")
    for ax, what in zip(axes, ("time to first token (ms)", "inter-token latency (ms)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests" if "first" in what else "fraction of gaps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"bench serve: {name}")
    fig.tight_layout()
    files = [out / f"serve-{name}-latency-cdf.png"]
    fig.savefig(files[0], dpi=80)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for r in ran:
        for tenant in sorted({t.tenant for t in r.timings}):
            pts = [(t.start, 1000 * t.ttft) for t in r.timings if t.ok and t.ttft is not None and t.tenant == tenant]
            label = f"{r.system}, {r.load}" + (f", {tenant}" if tenant != "default" else "")
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, label=label)
    ax.set_xlabel("request sent at (s)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(out / f"serve-{name}-ttft-timeline.png")
    fig.savefig(files[1], dpi=80)
    plt.close(fig)
    return files
