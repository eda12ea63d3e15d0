"""The sampler is device-correct, proven on this CPU with PyTorch's `meta` device.

The meta device refuses to mix devices (as CUDA does) and holds no values, so a
sampler step that runs there neither combines a CPU-made tensor with the logits
nor reads a value back per row (`int()`, `.tolist()`, `bool()` on a meta tensor
raise). Meta does let some ops take CPU index tensors that CUDA would refuse
(scatter, gather), so `OnlyOn` also checks every tensor every torch call sees.
Each creation site is then moved back to the CPU, one at a time, and the step must fail.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import engine.worker.logits_processors
import engine.worker.logprobs
import engine.worker.sampler
from engine.outputs import ScheduledChunk
from engine.worker.sampler import Sampler
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

V = 64


class OnlyOn(TorchFunctionMode):
    """Raises when a torch call takes or makes a tensor on another device than `device`."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.device != self.device:
                raise RuntimeError(f"{getattr(func, '__name__', func)} saw a tensor on {t.device}, not {self.device}")
        return out


def every_feature() -> list[ScheduledChunk]:
    """One batch that exercises every branch of a step: greedy and random rows, each transform, logprobs."""
    prompt, output = [1, 5, 9, 5], [7, 7, 3]

    def row(rid: str, **params: Any) -> ScheduledChunk:
        return ScheduledChunk(rid, [3], 6, [0], True, SamplingParams(max_tokens=50, **params), len(output), 2,
                              prompt, output)

    return [
        row("greedy", temperature=0.0, logprobs=3, logit_bias=((4, 5.0),)),
        row("plain"),
        row("seeded", seed=3, top_k=5, top_p=0.9, logprobs=0),
        row("penalised", repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, min_p=0.1),
        row("min-tokens", temperature=0.0, min_tokens=10, stop_token_ids=(6,), presence_penalty=1.0),
        row("biased", temperature=0.7, logit_bias=((1, -100.0), (2, 3.0)), logprobs=20),
        replace(row("constrained-min-tokens", min_tokens=10), grammar=GrammarSpec("json_object")),
    ]


def run_on_meta() -> engine.worker.sampler.DeviceSample:
    meta = torch.device("meta")
    logits = torch.empty(7, V, device=meta)
    with OnlyOn(meta):
        return Sampler().sample_on_device(logits, every_feature())


def test_a_whole_step_runs_on_the_meta_device_without_reading_back() -> None:
    out = run_on_meta()
    assert out.tokens.device.type == "meta" and out.tokens.shape == (7,)
    assert out.logprobs is not None and out.logprobs.top_ids.shape == (3, 20)


def test_the_same_step_on_the_cpu_gives_tokens() -> None:
    """The meta run is the real code path: on the CPU the same batch samples real tokens."""
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(0))
    with OnlyOn(torch.device("cpu")):
        out = Sampler().sample_with_logprobs(logits, every_feature())
    assert len(out.token_ids) == 7 and all(0 <= t < V for t in out.token_ids)
    assert out.token_ids[0] == 4  # bias +5 on id 4 over standard normal logits wins the argmax
    assert sorted(out.logprobs) == [0, 2, 5]


def _on_cpu(name: str) -> types.SimpleNamespace:
    """A stand-in for the `torch` module in which only `name` makes its tensors on the CPU."""
    real = getattr(torch, name)

    def cpu_made(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = "cpu"
        return real(*args, **kwargs)

    proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    setattr(proxy, name, cpu_made)
    return proxy


CREATION_SITES = [
    (engine.worker.logits_processors, "tensor"),  # token ids and per-row values (temperature, top-k/p, bias, penalties)
    (engine.worker.logits_processors, "arange"),  # top-k ranks
    (engine.worker.logits_processors, "zeros"),  # token counts
    (engine.worker.logits_processors, "ones"),  # scatter source of token counts
    (engine.worker.sampler, "empty"),  # the mixed greedy/random token vector
    (engine.worker.sampler, "tensor"),  # greedy and random row indices
    (engine.worker.logprobs, "tensor"),  # rows that asked for logprobs
]


@pytest.mark.parametrize(("module", "name"), CREATION_SITES, ids=[f"{m.__name__}.{n}" for m, n in CREATION_SITES])
def test_each_tensor_made_on_the_cpu_fails_the_meta_step(
    module: types.ModuleType, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_on_meta()  # clean as written
    monkeypatch.setattr(module, "torch", _on_cpu(name))
    with pytest.raises(RuntimeError, match="device|cpu"):
        run_on_meta()


def test_generators_are_made_on_the_logits_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta has no generators, so this one is checked by what the sampler asks for: the logits' device
    (a CPU generator cannot draw into a CUDA tensor)."""
    asked: list[torch.device] = []

    def generator(*, device: torch.device) -> torch.Generator:
        asked.append(device)
        return torch.Generator()

    monkeypatch.setattr(engine.worker.sampler, "torch", _on_cpu("Generator"))
    monkeypatch.setattr(engine.worker.sampler.torch, "Generator", generator)
    logits = torch.randn(7, V)
    Sampler().sample_on_device(logits, every_feature())
    assert len(asked) == 5 and all(d == logits.device for d in asked)  # one per random row
