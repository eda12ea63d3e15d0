"""An adapter evicted from the --max-cpu-loras host cache is read again off the step loop: the request
naming it waits (passed over like one whose adapter cannot join the step) while running streams keep
stepping, then runs on weights equal to the merged model's. A folder changed on disk since its load
fails only the requests that waited on it.

The read is held on a gate (the registry's loader, wrapped) so the test sees the loop step meanwhile.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config import LoraConfig
from engine.core import EngineCore
from engine.llm import LLM
from engine.request import Request, RequestStatus
from engine.step_failures import RequestsFailed
from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.errors import LoraError
from shared.sampling import SamplingParams
from tests.engine.model_fixtures import make_llm, random_prompts, tiny_model
from tests.support.lora_adapters import merged_folder, peft_adapter

__all__ = ["tiny_model"]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
STREAM = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
HELD_STEPS = 6


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (PEFT folder, merged model folder)."""
    root = tmp_path_factory.mktemp("evicted")
    out = {}
    for seed, (name, rank) in enumerate((("a", 4), ("b", 8))):
        folder = peft_adapter(tiny_model, root / name, rank=rank, alpha=2.0 * rank, seed=seed + 10)
        out[name] = (folder, merged_folder(tiny_model, folder, root / f"{name}-merged"))
    return out


class HeldReads:
    """Wraps the registry's loader: each read waits for `gate` and records its adapter and thread."""

    def __init__(self, core: EngineCore) -> None:
        assert core.loras is not None
        self.gate = threading.Event()
        self.started = threading.Event()
        """Set once a read is waiting at the gate (the reader thread runs when the OS schedules it)."""
        self.reads: list[tuple[str, str]] = []
        inner: Callable[[str, str, int], LoraAdapter] = core.loras._loader

        def held(path: str, name: str, load_id: int) -> LoraAdapter:
            self.reads.append((name, threading.current_thread().name))
            self.started.set()
            assert self.gate.wait(30.0), "the test never released the read"
            return inner(path, name, load_id)
        core.loras._loader = held


def _engine(tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> LLM:
    config = LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, (p, _) in adapters.items()),
                        max_loras=1, max_cpu_loras=1)
    return LLM(str(tiny_model), "float32", num_device_blocks=96, num_cpu_blocks=32, block_size=4, lora=config)


def _step(core: EngineCore, tokens: dict[str, list[int]]) -> None:
    for d in core.step():
        tokens[d.request_id] += d.new_token_ids


def test_evicted_adapters_are_read_off_the_loop_while_streams_step(
        tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> None:
    llm = _engine(tiny_model, adapters)
    core, registry = llm.core, llm.core.loras
    assert registry is not None and registry.num_resident == 1  # start-up kept one adapter's weights: the cap
    held = HeldReads(core)
    stream_prompt, prompt = random_prompts([11, 9], 512, seed=7)
    tokens: dict[str, list[int]] = defaultdict(list)
    core.add_request(Request("stream", stream_prompt, STREAM, arrival_time=0.0))
    _step(core, tokens)
    rounds = ["a", "b", "a"]  # each one evicted by the other (cap 1)
    for i, name in enumerate(rounds):
        held.gate.clear()
        req = Request(f"{name}{i}", prompt, GREEDY, arrival_time=0.0, lora_name=name)
        core.add_request(req)  # returns at once: the read is under way on the reader thread
        assert not registry.is_resident(req.lora_id)
        before = len(tokens["stream"])
        for _ in range(HELD_STEPS):
            _step(core, tokens)
        assert len(tokens["stream"]) == before + HELD_STEPS, "the running stream stalled behind the read"
        assert req.status is RequestStatus.WAITING and not tokens[req.request_id]
        held.gate.set()
        for _ in range(200):
            if req.status.finished:
                break
            _step(core, tokens)
        assert registry.num_resident <= 1
    while core.has_unfinished():
        _step(core, tokens)
    assert [name for name, _ in held.reads] == rounds  # one read per round, none on the loop
    assert all(thread.startswith("lora-load") for _, thread in held.reads)
    assert registry.evictions >= len(rounds)
    for i, name in enumerate(rounds):
        want = make_llm(adapters[name][1], blocks=96).generate(prompt, GREEDY, detokenize=False)[0].token_ids
        assert tokens[f"{name}{i}"] == want, f"round {i} ({name}) differs from its merged model"
    base = make_llm(tiny_model, blocks=96).generate(stream_prompt, STREAM, detokenize=False)[0].token_ids
    assert tokens["stream"] == base


def _touch(folder: Path) -> None:
    """A changed file under the same path: a new mtime (the stamp's), as a re-export would give it."""
    weights = folder / "adapter_model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_an_evicted_adapter_changed_on_disk_fails_its_requests_only(
        tiny_model: Path, adapters: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    copies = {}
    for name, (folder, merged) in adapters.items():
        copies[name] = (tmp_path / name, merged)
        (tmp_path / name).mkdir()
        for f in folder.iterdir():
            (tmp_path / name / f.name).write_bytes(f.read_bytes())
    llm = _engine(tiny_model, copies)
    core, registry = llm.core, llm.core.loras
    assert registry is not None and not registry.is_resident(registry._names["a"])
    held = HeldReads(core)
    tokens: dict[str, list[int]] = defaultdict(list)
    stream_prompt, prompt = random_prompts([11, 9], 512, seed=8)
    core.add_request(Request("stream", stream_prompt, STREAM, arrival_time=0.0))
    core.add_request(Request("a1", prompt, GREEDY, arrival_time=0.0, lora_name="a"))
    core.add_request(Request("a2", prompt, GREEDY, arrival_time=0.0, lora_name="a"))  # the same read
    _step(core, tokens)
    assert held.started.wait(10.0)
    _touch(copies["a"][0])  # changed while its read waits: the read must notice
    held.gate.set()
    with pytest.raises(RequestsFailed, match="changed on disk") as failed:
        for _ in range(50):
            _step(core, tokens)
    assert sorted(failed.value.request_ids) == ["a1", "a2"] and len(held.reads) == 1
    assert not tokens["a1"] and not tokens["a2"]
    before = len(tokens["stream"])
    _step(core, tokens)
    assert len(tokens["stream"]) == before + 1  # the others go on
    with pytest.raises(LoraError, match="changed on disk"):  # refused at once now: no read started
        core.add_request(Request("a3", prompt, GREEDY, arrival_time=0.0, lora_name="a"))
    assert len(held.reads) == 1
    core.add_request(Request("b1", prompt, GREEDY, arrival_time=0.0, lora_name="b"))  # b is resident
    while core.has_unfinished():
        _step(core, tokens)
    want = make_llm(copies["b"][1], blocks=96).generate(prompt, GREEDY, detokenize=False)[0].token_ids
    assert tokens["b1"] == want


def test_the_core_says_when_its_only_work_waits_on_a_read(
        tiny_model: Path, adapters: dict[str, tuple[Path, Path]]) -> None:
    """The engine server polls instead of spinning while waits_only_on_reads (test_server_lora.py)."""
    llm = _engine(tiny_model, adapters)
    core = llm.core
    held = HeldReads(core)
    tokens: dict[str, list[int]] = defaultdict(list)
    prompt = random_prompts([6], 512, seed=9)[0]
    core.add_request(Request("a1", prompt, GREEDY, arrival_time=0.0, lora_name="a"))  # "a" is evicted
    _step(core, tokens)
    assert core.waits_only_on_reads()  # an empty step, a read pending
    core.add_request(Request("base", prompt, GREEDY, arrival_time=0.0))
    _step(core, tokens)
    assert not core.waits_only_on_reads() and tokens["base"]  # a base request runs meanwhile
    held.gate.set()
    while core.has_unfinished():
        _step(core, tokens)
    assert not core.waits_only_on_reads() and len(tokens["a1"]) == GREEDY.max_tokens
