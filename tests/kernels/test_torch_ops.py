"""pageserve_kernels/torch_ops.py: C++ torch operators load, or the caller is told to keep its Python path.

The real source's build and use are tested through engine/worker/native_layers.py
(tests/engine/worker/test_native_layers.py); here, what happens when a build cannot succeed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pageserve_kernels import native_build, torch_ops


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    monkeypatch.setattr(native_build, "CSRC", csrc)
    monkeypatch.setenv("PAGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    torch_ops.load.cache_clear()
    yield csrc
    torch_ops.load.cache_clear()


def test_a_source_that_does_not_compile_leaves_the_python_path(sources: Path, caplog: pytest.LogCaptureFixture) -> None:
    (sources / "broken.cpp").write_text("this is not C++;\n")
    with caplog.at_level(logging.WARNING, "pageserve.kernels"):
        assert torch_ops.load("broken") is False
    assert "torch operators broken unavailable" in caplog.text and "error" in caplog.text  # the compiler's words


def test_no_compiler_and_the_switch_off_leave_the_python_path(sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (sources / "fine.cpp").write_text("int fine() { return 1; }\n")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", str(sources))  # no g++ to fall back on either
    assert torch_ops.load("fine") is False
    torch_ops.load.cache_clear()
    monkeypatch.setenv("PAGESERVE_NATIVE_KERNELS", "0")
    assert torch_ops.load("fine") is False
