import json
import subprocess
import sys

import pytest

from shared.model_store import ModelNotFoundError, resolve_model


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ModelNotFoundError, match="unknown model 'no-such-model'"):
        resolve_model("no-such-model")


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_hf_folder_is_used_as_is(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    files = resolve_model(str(tmp_path))
    assert files.path == tmp_path.resolve()
    assert files.name == tmp_path.name
    assert files.max_model_len == 512


def test_default_model_resolves_to_a_loadable_folder_without_torch():
    files = resolve_model("SmolLM2")  # converts once; later calls (and this subprocess) only read
    assert (files.path / "model.safetensors").is_file()
    assert (files.path / "tokenizer.json").is_file()
    assert files.config["num_hidden_layers"] == 30
    code = (
        "import sys; from shared.model_store import resolve_model; resolve_model('smollm2');"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gguf_cache_key_follows_content_not_location(tmp_path):
    """A re-installed package (new virtualenv: new path, new mtime) must reuse the conversion."""
    import os

    from shared.model_store import gguf_identity

    data = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB: a head, a middle and a tail
    first = tmp_path / "a" / "model.gguf"
    second = tmp_path / "b" / "model.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(data)
    os.utime(second, ns=(1, 1))
    assert gguf_identity(first) == gguf_identity(second)
    second.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # another last tensor
    assert gguf_identity(first) != gguf_identity(second)
    second.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # another header
    assert gguf_identity(first) != gguf_identity(second)
    second.write_bytes(data + b"\0")  # another size
    assert gguf_identity(first) != gguf_identity(second)
