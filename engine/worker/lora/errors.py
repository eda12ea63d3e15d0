"""The errors of LoRA adapters, importable without torch (the engine server maps them to wire codes)."""

from __future__ import annotations


class LoraError(ValueError):
    """An adapter this engine cannot serve (the message names the file, tensor or key): a 400."""

    param = "model"


class LoraNotFound(LoraError):
    """No adapter of that name is loaded (the gateway answers 404 model_not_found)."""
