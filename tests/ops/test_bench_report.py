"""Benchmark output: the serve table, per-tenant table, JSON of every request, charts, and missing peers said."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

from rich.console import Console

from ops.bench import serve
from ops.bench.memory import KvSample, fits_contiguous, report
from ops.bench.peer_table import print_peer_table
from ops.bench.serve_report import RunResult, plot, print_results, tenant_table, write_json
from ops.bench.serve_stats import RequestTiming, Slo
from ops.bench.vllm_peer import PeerResult, run_offline
from ops.bench.workloads import Workload, WorkloadRequest, make_random


def timing(i: int, tenant: str, ttft: float, error: str | None = None) -> RequestTiming:
    return RequestTiming(i, tenant, 0.1 * i, 10, 5, ttft, ttft + 0.4, (0.1, 0.1, 0.1, 0.1), error)


def render(fn: object, *args: object) -> str:
    console = Console(width=250, record=True)
    fn(*args, console=console)  # type: ignore[operator]
    return console.export_text()


def test_serve_table_has_every_system_and_says_why_one_is_missing() -> None:
    ok = RunResult("pageserve", "rate 2/s", "throughput", [timing(0, "default", 0.2), timing(1, "default", 0.4),
                                                            timing(2, "default", 0.3, "http 429 rate_limit_exceeded")],
                   2.0, Slo())
    missing = RunResult("vLLM serve", "-", "throughput", [], 0.0, Slo(), error="not run: pass --vllm-python PATH")
    text = render(print_results, [ok, missing], "t")
    assert "pageserve" in text and "2/3" in text and "http 429 rate_limit_exceeded: 1" in text
    assert "300/" in text  # TTFT p50 in ms
    assert "vLLM serve" in text and "not run: pass --vllm-python PATH" in text


def test_tenant_table_compares_the_light_tenant_with_alone() -> None:
    mixed = RunResult("pageserve", "rate 4/s", "multitenant",
                      [timing(0, "heavy", 1.0), timing(1, "heavy", 1.0), timing(2, "light", 0.3)], 3.0, Slo())
    alone = RunResult("pageserve (light alone)", "rate 4/s", "multitenant", [timing(2, "light", 0.2)], 1.0, Slo())
    console = Console(width=250, record=True)
    console.print(tenant_table(mixed, alone))
    text = console.export_text()
    assert "66.7%" in text and "33.3%" in text  # token shares
    assert "1.50x" in text  # light p99 TTFT 300 ms with the flood, 200 ms alone


def test_json_holds_every_requests_timings_and_no_nan(tmp_path: Path) -> None:
    empty = RunResult("vLLM serve", "-", "chat", [], 0.0, Slo(), error="not run")
    ok = RunResult("pageserve", "rate 1/s", "chat", [timing(0, "default", 0.2), timing(1, "default", 0.5)], 2.0, Slo())
    path = tmp_path / "r.json"
    write_json(str(path), [ok, empty], {"workload": "chat"})
    data = json.loads(path.read_text())  # strict: NaN would not parse back as null
    assert [r["system"] for r in data["runs"]] == ["pageserve", "vLLM serve"]
    assert [q["ttft"] for q in data["runs"][0]["requests"]] == [0.2, 0.5]
    assert data["runs"][1]["summary"]["ttft"]["p50"] is None and data["runs"][1]["error"] == "not run"


def test_plot_writes_pngs(tmp_path: Path) -> None:
    ok = RunResult("pageserve", "rate 1/s", "chat", [timing(i, "default", 0.1 + i / 10) for i in range(5)], 2.0, Slo())
    files = plot([ok], str(tmp_path), "chat")
    assert [f.name for f in files] == ["serve-chat-latency-cdf.png", "serve-chat-ttft-timeline.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_missing_or_failing_vllm_is_reported_not_skipped(tmp_path: Path) -> None:
    w = make_random(2, (8, 8), (3, 3))
    assert "pass --vllm-python" in (run_offline(None, "/m", "float32", w, False).error or "")
    assert "not an executable" in (run_offline(str(tmp_path / "nope"), "/m", "float32", w, False).error or "")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'boom: no vllm here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    failed = run_offline(str(fake), "/m", "float32", w, False)
    assert failed.error is not None and "exit 3" in failed.error and "boom" in failed.error
    fake.write_text('#!/bin/sh\necho \'RESULT {"seconds": 2.0, "output_tokens": 6, "vllm_version": "0.32.0"}\'\n')
    ran = run_offline(str(fake), "/m", "float32", w, True)
    assert ran.error is None and ran.tok_s == 3.0 and ran.prefix_caching


def test_peer_table_ratios_and_missing_rows() -> None:
    rows = [PeerResult("pageserve engine", 10.0, 1000), PeerResult("pageserve engine +prefix cache", 5.0, 1000,
                                                                   prefix_caching=True),
            PeerResult("vLLM offline", 8.0, 1000), PeerResult("vLLM offline +prefix cache", error="not run: x",
                                                              prefix_caching=True),
            PeerResult("HF static generate, batch 32", 40.0, 1000)]
    text = render(print_peer_table, rows, "t")
    assert "0.80x" in text  # pageserve 100 tok/s over vLLM's 125
    assert "4.00x" in text  # over HF's 25
    assert "not run: x" in text


def test_serve_without_vllm_python_keeps_a_row_saying_so() -> None:
    args = argparse.Namespace(vllm_python=None, slo_ttft=1.0, slo_itl=0.1)
    [row] = serve.run_vllm(Workload("chat", ()), args)
    assert row.error and "--vllm-python" in row.error


def test_memory_fits_and_waste() -> None:
    w = Workload("x", (WorkloadRequest((1,) * 100, 28), WorkloadRequest((1,) * 200, 56),
                       WorkloadRequest((1,) * 10, 10)))
    assert fits_contiguous(w, budget=400, max_model_len=128) == {"contiguous_max_len": 3,
                                                                  "contiguous_prompt_plus_max_tokens": 2}
    samples = [KvSample(0.0, 320, 300, 2, 1, 256, 384), KvSample(0.1, 0, 0, 0, 0, 0, 0)]
    rep = report(samples, w, 400, 128)
    assert abs(rep["waste_at_peak"]["paged"] - (1 - 300 / 320)) < 1e-9
    assert rep["concurrency"]["paged_peak"] == 2 and rep["concurrency"]["paged_mean"] == 2.0


def test_light_alone_phase_cannot_warm_the_prefix_cache_for_the_mixed_run() -> None:
    req = WorkloadRequest((49_151, 30, 31), 4, "light")
    other = serve.uncached(req)
    assert other.prompt[0] != req.prompt[0] and other.prompt[1:] == req.prompt[1:]
    assert other.prompt[0] >= 17 and other.output_len == 4 and other.tenant == "light"
    assert serve.uncached(req, 0) == req
    assert len({serve.uncached(req, s).prompt[0] for s in range(5)}) == 5  # one per run


def test_salting_keeps_a_shared_prefix_shared_within_a_run() -> None:
    from ops.bench.load import schedule
    from ops.bench.workloads import get_workload

    runs = [serve.salted(schedule(get_workload("chat"), None), s) for s in (0, 1)]
    for arrivals in runs:
        assert len({a.request.prompt[:384] for a in arrivals}) == 1
    assert runs[0][0].request.prompt[:384] != runs[1][0].request.prompt[:384]


def steady(i: int, ttft: float, gap: float, slow_gap: float | None = None) -> RequestTiming:
    gaps = (gap,) * 98 + ((slow_gap,) if slow_gap else (gap,)) * 2
    return RequestTiming(i, "default", 0.5 * i, 256, 101, ttft, ttft + sum(gaps), gaps)


def test_versus_table_marks_each_figure_where_ours_is_worse() -> None:
    from ops.bench.serve_report import print_versus

    ours = RunResult("pageserve", "rate 2/s", "random-256-128", [steady(i, 0.150, 0.030) for i in range(4)], 10.0, Slo())
    peer = RunResult("vLLM serve", "rate 2/s", "random-256-128", [steady(i, 0.100, 0.060) for i in range(4)], 12.0, Slo())
    text = render(print_versus, [ours, peer])
    row = next(line for line in text.splitlines() if "rate 2/s" in line)
    assert "150 / 100 WORSE" in row  # TTFT p50: ours later
    assert "30 / 60 ok" in row  # TPOT p50 and ITL p99: ours shorter
    assert "40.4 / 33.7 ok" in row  # output tok/s: 404 tokens in 10 s against 12 s
    assert render(print_versus, [ours]) == ""  # no peer: no table


def test_closed_loop_smoothness_says_whether_p99_itl_is_within_3x_the_median() -> None:
    from ops.bench.serve_report import closed_loop_label, smoothness_lines

    label = closed_loop_label(8)
    smooth = RunResult("pageserve", label, "w", [steady(i, 0.1, 0.030, 0.080) for i in range(8)], 9.0, Slo())
    rough = RunResult("pageserve", label, "w", [steady(i, 0.1, 0.030, 0.100) for i in range(8)], 9.0, Slo())
    rated = RunResult("pageserve", "rate 2/s", "w", [steady(i, 0.1, 0.030, 0.100) for i in range(8)], 9.0, Slo())
    [ok], [past] = smoothness_lines([smooth, rated]), smoothness_lines([rough])
    assert "2.67x (within 3x)" in ok and "closed loop, 8 streams" in ok
    assert "3.33x (PAST 3x)" in past
