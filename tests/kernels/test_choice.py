"""pageserve_kernels/choice.py: the faster candidate wins, a forced choice is obeyed, the cache key follows its inputs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from pageserve_kernels import choice


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "choices.json")  # the compiled kernels stay cached
    monkeypatch.delenv(choice.FORCE_ENV, raising=False)
    monkeypatch.delenv(choice.RETUNE_ENV, raising=False)


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def fakes() -> dict:
    return {"slow": sleeper(0.004), "fast": sleeper(0.0005)}


def test_the_faster_of_two_fake_candidates_is_picked_and_timed() -> None:
    picked = choice.choose("op", "k", ["slow", "fast"], fakes)
    assert picked.pick == "fast" and picked.how == "measured"
    assert picked.seconds["fast"] < picked.seconds["slow"]


def test_the_order_of_candidates_does_not_decide() -> None:
    assert choice.choose("op", "k", ["fast", "slow"], lambda: dict(reversed(fakes().items()))).pick == "fast"


def test_a_forced_choice_is_obeyed_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.FORCE_ENV, "other=x, op=slow")
    picked = choice.choose("op", "k", ["slow", "fast"], lambda: pytest.fail("a forced choice times nothing"))
    assert (picked.pick, picked.how) == ("slow", "forced")


def test_forcing_an_unknown_implementation_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.FORCE_ENV, "op=nope")
    with pytest.raises(choice.ChoiceError, match="op=nope"):
        choice.choose("op", "k", ["slow", "fast"], fakes)


def test_a_measured_choice_is_cached_on_disk_and_reused() -> None:
    first = choice.choose("op", "k", ["slow", "fast"], fakes)
    again = choice.choose("op", "k", ["slow", "fast"], lambda: pytest.fail("a cached choice times nothing"))
    assert (again.pick, again.how, again.seconds) == ("fast", "cached", first.seconds)
    assert "op|k" in choice.cached_choices()


def test_a_new_candidate_set_or_key_is_measured_again() -> None:
    choice.choose("op", "k", ["slow", "fast"], fakes)
    three = {**fakes(), "fastest": sleeper(0.0)}
    assert choice.choose("op", "k", ["slow", "fast", "fastest"], lambda: three).how == "measured"
    assert choice.choose("op", "k2", ["slow", "fast"], fakes).how == "measured"


def test_the_host_key_changes_with_cpu_flags_torch_version_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    base = choice.host_key()
    monkeypatch.setattr(choice, "cpu_flags_line", lambda: "flags: avx2 fma")
    flags = choice.host_key()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    version = choice.host_key()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    threads = choice.host_key()
    monkeypatch.setattr(choice, "cpu_model", lambda: "Another CPU")
    model = choice.host_key()
    monkeypatch.setattr(choice, "kernels_code_digest", lambda: "a changed kernel")
    assert len({base, flags, version, threads, model, choice.host_key()}) == 6


def test_the_code_digest_follows_the_kernel_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed C kernel or reference is timed anew: its old pick says nothing about its new rate."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.c").write_text("int f(void) { return 1; }")
    (tmp_path / "ref.py").write_text("x = 1")
    monkeypatch.setattr(choice, "__file__", str(tmp_path / "choice.py"))
    digests = []
    for change in (None, ("csrc/k.c", "int f(void) { return 2; }"), ("ref.py", "x = 2")):
        if change:
            (tmp_path / change[0]).write_text(change[1])
        choice.kernels_code_digest.cache_clear()
        digests.append(choice.kernels_code_digest())
    choice.kernels_code_digest.cache_clear()
    assert len(set(digests)) == 3


def test_retune_measures_again_and_replaces_the_cached_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    choice.choose("op", "k", ["slow", "fast"], fakes)
    monkeypatch.setenv(choice.RETUNE_ENV, "1")
    swapped = {"slow": sleeper(0.0), "fast": sleeper(0.004)}  # the host changed its mind
    assert choice.choose("op", "k", ["slow", "fast"], lambda: swapped).pick == "slow"
    monkeypatch.delenv(choice.RETUNE_ENV)
    assert choice.choose("op", "k", ["slow", "fast"], lambda: pytest.fail("cached")).pick == "slow"


def _competing(cores: float | None):
    """host_load.others_cores as if other processes used `cores` while we measured."""
    return lambda fn: (fn(), cores)


def test_a_pick_measured_beside_a_busy_neighbour_is_measured_again_on_a_quiet_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice.host_load, "others_cores", _competing(1.5))
    swapped = {"slow": sleeper(0.0), "fast": sleeper(0.004)}  # the neighbour made the slow one look fast
    busy = choice.choose("op", "k", ["slow", "fast"], lambda: swapped)
    assert (busy.pick, busy.busy) == ("slow", True)
    monkeypatch.setattr(choice.host_load, "quiet_now", lambda: False)  # still busy: the noisy pick is used
    assert choice.choose("op", "k", ["slow", "fast"], lambda: pytest.fail("timed again while busy")).how == "cached"
    monkeypatch.setattr(choice.host_load, "quiet_now", lambda: True)
    monkeypatch.setattr(choice.host_load, "others_cores", _competing(0.0))
    again = choice.choose("op", "k", ["slow", "fast"], fakes)
    assert (again.pick, again.how, again.busy) == ("fast", "measured", False)
    assert choice.choose("op", "k", ["slow", "fast"], lambda: pytest.fail("a quiet pick is kept")).pick == "fast"


@pytest.mark.parametrize("cores", [0.0, None])  # None: off Linux, unknown
def test_a_quiet_or_unknown_measurement_is_trusted(monkeypatch: pytest.MonkeyPatch, cores: float | None) -> None:
    monkeypatch.setattr(choice.host_load, "others_cores", _competing(cores))
    assert not choice.choose("op", "k", ["slow", "fast"], fakes).busy
    monkeypatch.setattr(choice.host_load, "quiet_now", lambda: pytest.fail("no probe for a trusted pick"))
    assert choice.choose("op", "k", ["slow", "fast"], fakes).how == "cached"
