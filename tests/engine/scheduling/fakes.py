"""A fake model runner with a simulated paged KV cache, and helpers to drive a Scheduler.

The fake "KV" of position p is a hash chained over the KV of p - 1 (read back from
the cache through the block table) and the token at p, so a value depends on the
whole prefix, as a real model's does. A sampled token is a hash of every KV value
of the request read through its block table. So any wrong block table, lost swap,
missing copy-on-write or bad prefix-cache hit changes the output, and "outputs equal
a run with unlimited memory" is a real check without a model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.outputs import RequestDelta, RunnerOutput, SchedulerOutput
from engine.request import Request
from engine.scheduling.scheduler import Scheduler, SchedulerConfig
from shared.sampling import SamplingParams

VOCAB = 64
EOS = 0
_MOD = (1 << 61) - 1


def mix(*values: int) -> int:
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h * 6364136223846793005 + v * 1442695040888963407 + 1) % _MOD
    return h


def kv_chain(tokens: Iterable[int]) -> list[int]:
    out, prev = [], 0
    for p, tok in enumerate(tokens):
        prev = mix(prev, tok, p)
        out.append(prev)
    return out


def sample_token(kvs: list[int], sampling: SamplingParams, num_output: int, eos: int | None) -> int:
    h = mix(*kvs)
    if not sampling.greedy and sampling.seed is not None:
        h = mix(h, sampling.seed, num_output)
    token = h % VOCAB
    stops = set(sampling.stop_token_ids) | ({eos} if eos is not None and not sampling.ignore_eos else set())
    while num_output < sampling.min_tokens and token in stops:  # what the sampler's masking does
        token = (token + 1) % VOCAB
    return token


def reference(
    prompt: list[int], sampling: SamplingParams, eos: int | None, max_model_len: int
) -> tuple[list[int], str]:
    """What one request alone with unlimited memory produces (the spec of stop conditions)."""
    tokens, out = list(prompt), []
    while True:
        tok = sample_token(kv_chain(tokens), sampling, len(out), eos)
        out.append(tok)
        tokens.append(tok)
        stops = set(sampling.stop_token_ids) | (
            {eos} if eos is not None and not sampling.ignore_eos else set()
        )
        if len(out) > sampling.min_tokens and tok in stops:
            return out, "stop"
        if len(out) >= sampling.max_tokens or len(tokens) >= max_model_len:
            return out, "length"


class FakeRunner:
    def __init__(
        self, num_device_blocks: int, num_cpu_blocks: int, block_size: int, copy_last: bool = False
    ) -> None:
        self.bs = block_size
        self.copy_last = copy_last
        """Apply copies after swap-ins (engine/worker/kv_cache.py's order) instead of before."""
        self.device: list[list[int | None]] = [[None] * block_size for _ in range(num_device_blocks)]
        self.cpu: list[list[int | None]] = [[None] * block_size for _ in range(num_cpu_blocks)]
        self.steps = 0

    def _read(self, block_ids: list[int], p: int) -> int:
        value = self.device[block_ids[p // self.bs]][p % self.bs]
        assert value is not None, f"position {p} read before it was written"
        return value

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.steps += 1
        # Swap-out first, as the scheduler requires; copies and swap-ins in either order.
        for dev, cpu in out.blocks_to_swap_out:
            self.cpu[cpu] = list(self.device[dev])
        moves = [
            (self.device, out.blocks_to_copy, self.device),
            (self.cpu, out.blocks_to_swap_in, self.device),
        ]
        for src_pool, pairs, dst_pool in reversed(moves) if self.copy_last else moves:
            for src, dst in pairs:
                dst_pool[dst] = list(src_pool[src])
        for chunk in out.chunks:
            assert len(chunk.block_ids) * self.bs >= chunk.start_position + len(chunk.token_ids)
            prev = self._read(chunk.block_ids, chunk.start_position - 1) if chunk.start_position else 0
            for k, tok in enumerate(chunk.token_ids):
                p = chunk.start_position + k
                prev = mix(prev, tok, p)
                self.device[chunk.block_ids[p // self.bs]][p % self.bs] = prev
        sampled = {}
        for chunk in out.chunks:
            if chunk.sample:
                end = chunk.start_position + len(chunk.token_ids)
                kvs = [self._read(chunk.block_ids, p) for p in range(end)]
                sampled[chunk.request_id] = sample_token(
                    kvs, chunk.sampling, chunk.num_output_tokens, chunk.eos_token_id
                )
        return RunnerOutput(sampled)


_ids = itertools.count()


def make_request(
    prompt: list[int] | int,
    max_tokens: int = 8,
    request_id: str | None = None,
    eos: int | None = EOS,
    **kwargs: object,
) -> Request:
    """A request; `prompt` is a token list or a length (then distinct non-EOS tokens)."""
    sampling_keys = {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
    }
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=kwargs.pop("temperature", 0.0),  # type: ignore[arg-type]
        **{k: kwargs.pop(k) for k in list(kwargs) if k in sampling_keys},  # type: ignore[arg-type]
    )
    rid = request_id or f"r{next(_ids)}"
    tokens = (
        prompt
        if isinstance(prompt, list)
        else [1 + mix(*map(ord, rid), i) % (VOCAB - 1) for i in range(prompt)]
    )
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling=sampling,
        arrival_time=0.0,
        eos_token_id=eos,
        **kwargs,  # type: ignore[arg-type]
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(
    num_device_blocks: int = 64,
    num_cpu_blocks: int = 64,
    block_size: int = 4,
    clock: Callable[[], float] | None = None,
    **config: object,
) -> tuple[Scheduler, FakeRunner]:
    defaults: dict[str, object] = {"max_num_seqs": 8, "max_num_batched_tokens": 32, "max_model_len": 256}
    cfg = SchedulerConfig(**(defaults | config))  # type: ignore[arg-type]
    sched = Scheduler(cfg, num_device_blocks, num_cpu_blocks, block_size, clock=clock or FakeClock())
    return sched, FakeRunner(num_device_blocks, num_cpu_blocks, block_size)


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    first_step: int | None = None


@dataclass
class Run:
    results: dict[tuple[str, int], Result] = field(default_factory=dict)
    outputs: list[SchedulerOutput] = field(default_factory=list)
    steps: int = 0

    def record(self, deltas: list[RequestDelta], step: int) -> None:
        for d in deltas:
            res = self.results.setdefault((d.request_id, d.index), Result())
            assert res.finish_reason is None, f"{d.request_id}#{d.index}: delta after finish"
            if d.new_token_ids and res.first_step is None:
                res.first_step = step
            res.tokens += d.new_token_ids
            assert d.num_output_tokens == len(res.tokens)
            res.finish_reason = d.finish_reason
            res.num_cached_tokens = d.num_cached_tokens


def step(sched: Scheduler, runner: FakeRunner, run: Run, check: bool = True) -> SchedulerOutput:
    out = sched.schedule()
    if check:
        sched.check_invariants()
    deltas = sched.update(out, runner.execute(out))
    if check:
        sched.check_invariants()
    run.steps += 1
    run.outputs.append(out)
    run.record(deltas, run.steps)
    return out


def run_to_end(sched: Scheduler, runner: FakeRunner, run: Run | None = None, max_steps: int = 5000) -> Run:
    run = run or Run()
    while sched.has_unfinished():
        assert run.steps < max_steps, "no progress"
        step(sched, runner, run)
    return run
