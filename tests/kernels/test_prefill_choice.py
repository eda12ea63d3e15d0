"""pageserve_kernels/prefill_choice.py: the two prompt-attention paths are timed on the same step, the
faster is planned, a forced one is obeyed, and neither is offered where the C kernel is not built."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pageserve_kernels import choice, cpu_prefill, prefill_choice

pytestmark = pytest.mark.skipif(cpu_prefill.load() is None, reason="no C prefill kernel here: nothing to choose")
SHAPE = (torch.float32, 4, 2, 32, 4)  # dtype, query heads, KV heads, head size, block size: a tiny model's


@pytest.fixture(autouse=True)
def _own_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    monkeypatch.delenv(choice.RETUNE_ENV, raising=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_timers_run_each_path_once_to_the_same_result(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    kernel_call = cpu_prefill.NativePrefill.__call__

    def counted(self: cpu_prefill.NativePrefill, *args: object) -> None:
        calls.append(args)
        kernel_call(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_prefill.NativePrefill, "__call__", counted)
    timers = prefill_choice.timers(dtype, 9, 3, 64, 16)
    torch_out = timers["torch"]()
    assert not calls  # PyTorch's attention, not the C kernel under another name
    c_out = timers["c"]()
    assert len(calls) == 1 and len(calls[0][4]) == len(prefill_choice.TIMING_CHUNKS)  # one call, every chunk
    assert torch_out.shape == (sum(new for new, _ in prefill_choice.TIMING_CHUNKS), 9, 64)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(c_out.float(), torch_out.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("slow", ["c", "torch"])
def test_the_faster_path_is_planned(slow: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = prefill_choice.timers

    def slowed(*args: object) -> dict[str, Callable[[], object]]:
        made: dict[str, Callable[[], object]] = dict(real(*args))  # type: ignore[arg-type]
        run = made[slow]
        made[slow] = lambda: (time.sleep(0.05), run())
        return made

    monkeypatch.setattr(prefill_choice, "timers", slowed)
    assert prefill_choice.native_prompts_win(*SHAPE) == (slow == "torch")
    stored = choice.cached_choices()["prefill_attention|float32 n_q=4 n_kv=2 hd=32 block=4"]
    assert stored["pick"] != slow and stored["seconds"][slow] > 0.05 > stored["seconds"][stored["pick"]]


def test_a_forced_path_is_obeyed_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefill_choice, "timers", lambda *args: pytest.fail("a forced choice times nothing"))
    monkeypatch.setenv(choice.FORCE_ENV, "prefill_attention=torch")
    assert not prefill_choice.native_prompts_win(*SHAPE)
    monkeypatch.setenv(choice.FORCE_ENV, "prefill_attention=c")
    assert prefill_choice.native_prompts_win(*SHAPE)
    monkeypatch.setenv(choice.FORCE_ENV, "prefill_attention=amx")
    with pytest.raises(choice.ChoiceError, match="prefill_attention=amx"):
        prefill_choice.native_prompts_win(*SHAPE)


def test_no_c_kernel_no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefill_choice, "timers", lambda *args: pytest.fail("nothing to time"))
    assert not prefill_choice.native_prompts_win(torch.float32, 4, 2, 24, 4)  # head size not a multiple of 16
    monkeypatch.setattr(cpu_prefill, "load", lambda: None)
    assert not prefill_choice.native_prompts_win(*SHAPE)


def test_a_plan_without_native_prompts_leaves_chunks_to_pytorch() -> None:
    plan = prefill_choice.plan_attention([1, 6], [9, 6], [[0, 1, 2], [3, 4]], 4, native=True, native_prompts=False)
    assert plan.native_decode is not None and not plan.prompts_in_c and len(plan.chunks) == 1
    assert plan.native_prefill is not None  # laid out all the same: the C++ layer loop calls PyTorch's attention
    default = prefill_choice.plan_attention([1, 6], [9, 6], [[0, 1, 2], [3, 4]], 4, native=True)
    assert default.prompts_in_c
