"""A step that fails for reasons of its requests fails those requests only; the core serves on.

Real EngineCore on the tiny random Llama; the failure is injected into the sampler
(the path a bad sampling value or a stop check takes) or into the block moves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core import EngineCore
from engine.request import Request
from engine.step_failures import EngineStateLost, RequestsFailed, is_fatal
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, tiny_model
from tests.engine.test_core import assert_nothing_held

__all__ = ["tiny_model"]


def _add(core: EngineCore, rid: str, prompt: list[int], max_tokens: int = 6) -> None:
    core.add_request(Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                             arrival_time=0.0))


def _run(core: EngineCore) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while core.has_unfinished():
        for d in core.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    return out


def test_a_failing_sample_fails_its_step_and_the_core_serves_on(tiny_model: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_llm(tiny_model, budget=128, max_model_len=128).core
    prompt = list(range(5, 45))  # 40 tokens: full blocks that the prefix cache registers
    _add(core, "a", prompt)
    _add(core, "b", prompt[:20])
    real = core.runner.sampler.sample_with_logprobs

    def broken(*args: object) -> list[int]:
        raise IndexError("index 999999 is out of bounds for dimension 1 with size 512")

    monkeypatch.setattr(core.runner.sampler, "sample_with_logprobs", broken)
    with pytest.raises(RequestsFailed) as caught:
        core.step()
    assert caught.value.request_ids == ["a", "b"] and "IndexError" in caught.value.message
    # Their blocks are free, and KV that failed forward may have written is not served from the cache.
    assert core.scheduler.bm.device.num_cached == 0
    monkeypatch.setattr(core.runner.sampler, "sample_with_logprobs", real)
    assert_nothing_held(core)
    _add(core, "after", prompt)
    assert len(_run(core)["after"]) == 6
    assert_nothing_held(core)


def test_a_step_failure_leaves_other_requests_alone(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_llm(tiny_model, budget=128, max_model_len=128).core
    _add(core, "early", list(range(5, 15)), max_tokens=12)
    core.step()  # "early" is decoding
    real = core.runner.sampler.sample_with_logprobs
    calls = {"n": 0}

    def fail_once(logits: object, rows: list[object]) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("bad sampling value")
        return real(logits, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(core.runner.sampler, "sample_with_logprobs", fail_once)
    with pytest.raises(RequestsFailed):
        core.step()  # "early" was in the step: it fails
    _add(core, "late", list(range(20, 30)))
    assert len(_run(core)["late"]) == 6
    assert_nothing_held(core)


def test_errors_that_leave_the_state_unknown_stay_fatal(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_llm(tiny_model, budget=128, max_model_len=128).core
    _add(core, "a", [5, 6, 7])

    def broken(*args: object) -> None:
        raise RuntimeError("swap failed")

    monkeypatch.setattr(core.runner.kv_cache, "move_blocks", broken)
    with pytest.raises(EngineStateLost):
        core.step()
    assert is_fatal(AssertionError("invariant")) and is_fatal(MemoryError())
    assert is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_fatal(IndexError("index out of range")) and not is_fatal(ValueError("nan"))
