"""PAGESERVE_CPU_ISA=avx2: this host takes an AVX2-only host's paths (pageserve_kernels/isa_cap.py).

The kernel test runs on any host: where the CPU has AVX-512 it proves the cap removes those
loops from the build; on an AVX2-only host the build has none to remove and the test still
checks that the capped build loads and runs its AVX2 loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ops import cli
from pageserve_kernels import cpu_decode, cpu_features, isa_cap, native_build

ROOT = Path(__file__).resolve().parents[2]
LINE = "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile avx_vnni\n"


def test_the_cap_hides_avx512_and_amx_flags() -> None:
    kept = isa_cap.visible_flags(LINE, isa_cap.CAPS["avx2"]).partition(":")[2].split()
    assert kept == ["fpu", "sse2", "avx", "avx2", "fma", "avx_vnni"]
    assert isa_cap.visible_flags(LINE, None) == LINE


def test_capped_flags_mean_float32_and_no_bf16_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa_cap, "proc_flags_line", lambda: LINE)
    assert cpu_features.has_bf16_hardware()
    monkeypatch.setenv(isa_cap.ISA_ENV, "avx2")
    assert not cpu_features.has_bf16_hardware()
    assert cpu_features.has_avx2_fma()
    assert "avx512f" not in cpu_features.cpu_flags_line()
    assert isa_cap.host_summary().endswith("avx2 fma (capped: PAGESERVE_CPU_ISA=avx2)")


def test_an_unknown_cap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(isa_cap.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="known caps are native, avx2"):
        isa_cap.active()
    assert cli.main(["generate", "--help"]) == 2
    assert "PAGESERVE_CPU_ISA='sse9'" in capsys.readouterr().err


def test_library_switches_are_set_and_never_override() -> None:
    env = {isa_cap.ISA_ENV: "avx2", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    assert isa_cap.apply_library_env(env) is isa_cap.CAPS["avx2"]
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"  # the caller's own value wins
    untouched = {"PATH": "/bin"}
    assert isa_cap.apply_library_env(untouched) is None and untouched == {"PATH": "/bin"}


def test_capped_decode_kernel_builds_without_avx512_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    native = cpu_decode.load()
    if native is None:
        pytest.skip("no C compiler: the PyTorch path has no loops to cap")
    monkeypatch.setenv(isa_cap.ISA_ENV, "avx2")
    lib = native_build.try_load_kernel("paged_decode")
    assert lib is not None
    capped = cpu_decode.NativeDecode(lib)
    assert capped.variants == ("scalar", "avx2")
    assert set(native.variants) >= set(capped.variants)


def test_pageserve_sets_the_library_switches_before_the_command_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in isa_cap.CAPS["avx2"].library_env:  # recorded, so the test leaves them as it found them
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv(isa_cap.ISA_ENV, "avx2")
    seen: dict[str, str | None] = {}

    def import_module(name: str) -> SimpleNamespace:
        seen["aten"] = os.environ.get("ATEN_CPU_CAPABILITY")
        return SimpleNamespace(main=lambda argv: 0)

    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    assert cli.main(["generate"]) == 0
    assert seen == {"aten": "avx2"}


def test_vllm_worker_answers_torch_isa_checks_false_under_the_cap() -> None:
    """What makes vLLM load its AVX2 kernels (vllm/platforms/cpu.py reads these checks)."""
    probe = ("import sys, torch; sys.path.insert(0, 'ops/bench'); import vllm_worker; "
             "print(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported(), "
             "torch.cpu._is_amx_tile_supported())")
    env = {**os.environ, isa_cap.ISA_ENV: "avx2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
