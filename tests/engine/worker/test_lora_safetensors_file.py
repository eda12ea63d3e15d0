"""engine/worker/lora/safetensors_file.py: the kept read buffer is never handed to two reads at once, and a
header that is not safetensors is a LoraError naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.worker.lora import safetensors_file
from engine.worker.lora.errors import LoraError
from engine.worker.lora.safetensors_file import as_buffer, peek_header, read_file, read_header


def test_a_read_inside_another_gets_its_own_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 100)
    b.write_bytes(b"y" * 50)
    with read_file(a) as outer:
        with read_file(b) as inner:  # the kept buffer is the outer read's: this one reads into its own
            assert bytes(as_buffer(inner)) == b"y" * 50
        assert bytes(as_buffer(outer)) == b"x" * 100
    with read_file(b) as again, read_file(a) as other:
        assert bytes(as_buffer(again)) == b"y" * 50 and bytes(as_buffer(other)) == b"x" * 100


@pytest.mark.parametrize(("content", "match"), [(b"abc", "shorter than a safetensors header"),
                                                 ((1000).to_bytes(8, "little") + b"{}", "header of 1000 bytes"),
                                                 ((2).to_bytes(8, "little") + b"[]", "not a JSON object")])
def test_a_header_that_is_not_safetensors_is_named(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(content)
    with read_file(path) as data, pytest.raises(LoraError, match=match):
        read_header(path, data)


@pytest.mark.parametrize("size", [1, 4095, 4096, 3 * 4096 + 17])
@pytest.mark.parametrize("direct", [True, False])
def test_direct_and_page_cache_reads_give_the_file_exactly(tmp_path: Path, size: int, direct: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """O_DIRECT reads whole pages into a page-aligned buffer: the bytes past the file's end are not the file's.
    Where a file system refuses O_DIRECT (tmpfs before Linux 6.6) the plain read serves it."""
    if not direct:
        monkeypatch.setattr(safetensors_file, "_read_direct", lambda path, into, size: None)
    content = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    for folder in [tmp_path] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else []):
        path = folder / f"pageserve-test-{size}.bin"
        path.write_bytes(content)
        try:
            with read_file(path) as data:
                assert data.numel() == size and bytes(as_buffer(data)) == content
        finally:
            path.unlink()


def test_a_peeked_header_describes_the_file_only_while_it_is_unchanged(tmp_path: Path) -> None:
    """The header read before the file is reused only for the same bytes: a file rewritten in between (another
    layout, or the same header over another size) is parsed again from what was read."""
    path = tmp_path / "adapter_model.safetensors"
    save_file({"a": torch.zeros(2, 3)}, str(path))
    header = peek_header(path)
    assert header is not None and set(header.tensors) == {"a"}
    with read_file(path) as data:
        assert header.describes(data)
    save_file({"a": torch.zeros(3, 2)}, str(path))  # same size, another shape
    with read_file(path) as data:
        assert not header.describes(data)
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(1)}, str(path))
    with read_file(path) as data:
        assert not header.describes(data)
