"""Beam groups and best_of in the pure scheduler, over the fake runner's simulated KV cache.

The fake runner's candidates and logprobs are hashes of the KV read through each request's
block table (fakes.py), so a lost swap, a missing copy-on-write or a wrong fork changes the
beams: "the same beams under memory pressure as with room to spare" is a real check.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.outputs import RequestDelta, RunnerOutput, SchedulerOutput
from engine.request import Request, RequestStatus
from engine.scheduling.scheduler import Scheduler
from shared.protocol import TokenLogprob
from shared.sampling import SamplingParams
from tests.engine.scheduling.fakes import VOCAB, FakeRunner, make_request, make_scheduler, mix


def fake_logprob(h: int, token: int) -> float:
    return -((mix(h, token) % 10_000) / 1000.0)


class CandidateRunner(FakeRunner):
    """The fake runner, plus beam candidates and sampled-token logprobs from the same KV hashes."""

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        result = super().execute(out)
        candidates, logprobs = {}, {}
        for chunk in out.chunks:
            if not chunk.sample:
                continue
            end = chunk.start_position + len(chunk.token_ids)
            h = mix(*[self._read(chunk.block_ids, p) for p in range(end)])
            if chunk.sampling.beam_width:
                ranked = sorted(range(VOCAB), key=lambda t: -fake_logprob(h, t))[: 2 * chunk.sampling.beam_width]
                candidates[chunk.request_id] = [(t, fake_logprob(h, t)) for t in ranked]
            if chunk.sampling.logprobs is not None:
                token = result.sampled_token_ids[chunk.request_id]
                logprobs[chunk.request_id] = TokenLogprob(fake_logprob(h, token), [], [])
        return RunnerOutput(result.sampled_token_ids, logprobs, beam_candidates=candidates)


def scheduler(num_device_blocks: int, **config: object) -> tuple[Scheduler, CandidateRunner]:
    sched, _ = make_scheduler(num_device_blocks=num_device_blocks, block_size=4, **config)
    return sched, CandidateRunner(num_device_blocks, 64, 4)


def beam_request(rid: str, prompt: int, max_tokens: int, width: int = 4) -> Request:
    req = make_request(prompt, max_tokens=max_tokens, request_id=rid, eos=None)
    sampling = SamplingParams(n=width, use_beam_search=True, temperature=0, max_tokens=max_tokens)
    return dataclasses.replace(req, sampling=sampling)


def drive(sched: Scheduler, runner: CandidateRunner, watch: str | None = None) -> dict[tuple[str, int], RequestDelta]:
    """Run to the end; each choice's deltas joined. `watch`: a beam group whose live beams must
    always be in one place (running, swapped or waiting) after every step."""
    final: dict[tuple[str, int], RequestDelta] = {}
    for _ in range(2000):
        if not sched.has_unfinished():
            return final
        out = sched.schedule()
        sched.check_invariants()
        for d in sched.update(out, runner.execute(out)):
            prev = final.get((d.request_id, d.index))
            if prev is not None:  # a streaming request: the whole choice so far
                d = dataclasses.replace(d, new_token_ids=prev.new_token_ids + d.new_token_ids,
                                        logprobs=prev.logprobs + d.logprobs)
            final[(d.request_id, d.index)] = d
        sched.check_invariants()
        if watch is not None and watch in sched._groups:
            group = sched._groups[watch]
            places = {r.status for r in group.live if r not in group.pending}
            assert len(places) <= 1, f"the beam group is split: {places}"
    raise AssertionError("no progress")


def beams_of(final: dict[tuple[str, int], RequestDelta], rid: str) -> list[list[int]]:
    return [final[(rid, i)].new_token_ids for i in range(4)]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_beam_group_is_preempted_and_resumed_whole(mode: str) -> None:
    roomy, runner = scheduler(64)
    roomy.add_request(beam_request("beam", prompt=10, max_tokens=12))
    roomy.add_request(make_request(30, max_tokens=16, request_id="other", eos=None))
    want = drive(roomy, runner)
    # The group alone needs up to 18 blocks; a recomputed group comes back in one step's budget.
    tight, runner = scheduler(20, preemption_mode=mode, max_num_batched_tokens=128)
    tight.add_request(beam_request("beam", prompt=10, max_tokens=12))
    tight.add_request(make_request(30, max_tokens=16, request_id="other", eos=None))  # admitted beside it
    got = drive(tight, runner, watch="beam")
    assert tight.stats().preemptions > 0
    if mode == "swap":
        assert tight.stats().swaps_out > 0
    assert beams_of(got, "beam") == beams_of(want, "beam")
    assert got[("other", 0)].new_token_ids == want[("other", 0)].new_token_ids
    assert tight.bm.num_free_device_blocks == 20 and tight.bm.num_free_cpu_blocks == 64  # nothing leaks


def test_beams_stream_nothing_until_the_search_ends_and_abort_as_n_choices() -> None:
    sched, runner = scheduler(64)
    sched.add_request(beam_request("b", prompt=6, max_tokens=5, width=3))
    for _ in range(3):
        out = sched.schedule()
        assert sched.update(out, runner.execute(out)) == []
    aborted = sched.abort_requests(["b"])
    assert [(d.index, d.finish_reason, d.new_token_ids) for d in aborted] == [(i, "abort", []) for i in range(3)]
    assert not sched.has_unfinished() and sched.bm.num_free_device_blocks == 64


def best_of_request(rid: str, n: int, best_of: int, seed: int, logprobs: int | None = None) -> Request:
    req = make_request(9, max_tokens=6, request_id=rid, eos=None)
    sampling = SamplingParams(n=n, best_of=best_of, seed=seed, temperature=1.0, max_tokens=6, logprobs=logprobs)
    return dataclasses.replace(req, sampling=sampling, prompt_token_ids=list(range(1, 10)))


def test_best_of_returns_the_n_best_by_cumulative_logprob_and_counts_all() -> None:
    sched, runner = scheduler(64)
    for i in range(4):  # each candidate alone: sample i of best_of runs with seed + i
        sched.add_request(best_of_request(f"alone{i}", 1, 1, seed=3 + i, logprobs=0))
    alone = drive(sched, runner)
    cumulative = {i: sum(lp.logprob for lp in alone[(f"alone{i}", 0)].logprobs) for i in range(4)}
    sched, runner = scheduler(64)
    sched.add_request(best_of_request("bo", 2, 4, seed=3))
    deltas = []
    while sched.has_unfinished():
        out = sched.schedule()
        deltas.append(sched.update(out, runner.execute(out)))
    assert all(d == [] for d in deltas[:-1])  # nothing streams: the winners are known only at the end
    best = sorted(range(4), key=lambda i: -cumulative[i])
    final = deltas[-1]
    assert [d.index for d in final] == [0, 1]
    assert [d.new_token_ids for d in final] == [alone[(f"alone{i}", 0)].new_token_ids for i in best[:2]]
    assert all(d.logprobs == [] for d in final)  # the client did not ask for them
    assert final[0].num_unreturned_tokens == 6 * 2 and final[1].num_unreturned_tokens == 0
    assert sched.bm.num_free_device_blocks == 64


def test_best_of_with_client_logprobs_returns_the_winners_logprobs() -> None:
    sched, runner = scheduler(64)
    sched.add_request(best_of_request("bo", 1, 3, seed=5, logprobs=2))
    final = drive(sched, runner)
    assert list(final) == [("bo", 0)]
    assert len(final[("bo", 0)].logprobs) == 6
    assert final[("bo", 0)].finish_reason == RequestStatus.FINISHED_LENGTH.value


def test_every_beams_tokens_count_as_usage() -> None:
    sched, runner = scheduler(64)
    req = beam_request("b", prompt=6, max_tokens=5)
    sched.add_request(dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, n=2, best_of=4)))
    final = drive(sched, runner)
    assert sorted(final) == [("b", 0), ("b", 1)]  # the 2 best of 4 beams
    # 4 beams x 5 tokens generated, 2 x 5 returned: the other 10 are counted, on choice 0.
    assert [final[("b", i)].num_unreturned_tokens for i in range(2)] == [10, 0]
