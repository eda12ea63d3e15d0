"""The engine: one process owning the model and its paged KV cache. It sees token ids only.

    request.py     one request's state: token ids, num_computed_tokens, block table, status, priority
    outputs.py     the plain data of one step: SchedulerOutput -> RunnerOutput -> RequestDelta
    core.py        EngineCore.step(): scheduler.schedule() -> runner.execute() -> scheduler.update()
    config.py      frozen EngineConfig (model, cache, scheduler, attention backend)
    llm.py         the offline API, LLM(...).generate(prompts, params)
    scheduling/    pure-Python scheduling: scheduler, queue, preemption, block manager, prefix cache
    worker/        the device side: model runner, inputs, KV cache, sampler, loader, models/, layers/
    serving/       the ZeroMQ server process around EngineCore

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
