"""The engine: one process owning the model and its paged KV cache.

`from engine import LLM, SamplingParams` is the offline API; the submodules are
imported lazily so that `import engine.request` (pure Python) never pays for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.sampling import SamplingParams

if TYPE_CHECKING:
    from engine.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
