"""The C kernels as files: every pageserve_kernels/csrc/*.c compiles, ships as package data (with the C++ of
pageserve_kernels/torch_ops.py), rebuilds on a header edit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pageserve_kernels import native_build

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.stem for p in native_build.CSRC.glob("*.c")))
def test_every_kernel_file_compiles_and_loads(name: str) -> None:
    assert native_build.load_library(name, native_build.kernel_source(name)) is not None


def test_kernel_sources_are_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["pageserve_kernels"]
    shipped = {p for pattern in patterns for p in (ROOT / "pageserve_kernels").glob(pattern)}
    assert shipped == set(native_build.CSRC.glob("*.[ch]")) | set(native_build.CSRC.glob("*.cpp")) and shipped


def test_a_header_edit_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    monkeypatch.setattr(native_build, "CSRC", csrc)
    monkeypatch.setenv("PAGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    source = '#include "answer.h"\nint answer(void) { return ANSWER; }\n'
    (csrc / "answer.h").write_text("#define ANSWER 41\n")
    first = native_build.build("answer", source)
    (csrc / "answer.h").write_text("#define ANSWER 42\n")
    second = native_build.build("answer", source)
    assert first != second
    assert native_build.load_library("answer", source).answer() == 42
