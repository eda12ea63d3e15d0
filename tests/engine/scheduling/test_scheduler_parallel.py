"""n > 1 parallel sampling: the prompt's blocks are shared, the partial block copied on write,
and sample i equals a lone request with seed + i."""

from __future__ import annotations

import dataclasses

from tests.engine.scheduling.fakes import Run, make_request, make_scheduler, reference, run_to_end, step


def distinct_blocks(sched) -> int:  # type: ignore[no-untyped-def]
    return sum(b.ref_cnt > 0 for b in sched.bm.device.blocks)


def test_four_samples_hold_the_prompt_blocks_once() -> None:
    prompt = list(range(1, 11))  # 10 tokens, block_size 4: [1..4][5..8][9 10]
    sched, runner = make_scheduler(block_size=4, enable_prefix_caching=False)
    req = make_request(prompt, max_tokens=3, n=4, seed=7, temperature=1.0, request_id="par")
    sched.add_request(req)
    run = Run()
    first = step(sched, runner, run)
    assert [c.request_id for c in first.chunks] == ["par#0"]  # the leader prefills alone
    second = step(sched, runner, run)
    # Followers recompute only the last prompt token, copying the shared partial block.
    followers = [c for c in second.chunks if c.request_id != "par#0"]
    assert [(c.start_position, c.token_ids) for c in followers] == [(9, [10])] * 3
    # Every sample now writes into the shared partial block: all but the last writer copy it.
    original = first.chunks[0].block_ids
    tables = [c.block_ids for c in second.chunks]
    assert len(second.blocks_to_copy) == 3
    assert all(src == original[2] for src, _ in second.blocks_to_copy)
    assert all(t[:2] == original[:2] for t in tables)  # the full prompt blocks are shared
    assert len({t[2] for t in tables}) == 4
    # Measured: 3 prompt blocks + 3 copied partial blocks, against 4 x 3 for separate requests.
    assert distinct_blocks(sched) == 6
    separate, runner2 = make_scheduler(block_size=4, enable_prefix_caching=False, max_num_batched_tokens=64)
    for i in range(4):
        separate.add_request(make_request(prompt, max_tokens=2, request_id=f"alone{i}"))
    step(separate, runner2, Run())
    assert distinct_blocks(separate) == 12
    run_to_end(sched, runner, run)
    assert sched.stats().free_device_blocks == 64


def test_each_sample_matches_the_same_seed_alone() -> None:
    prompt = list(range(5, 18))
    sched, runner = make_scheduler(block_size=4, num_device_blocks=12, max_num_seqs=4)
    req = make_request(prompt, max_tokens=9, n=4, seed=100, temperature=1.0, request_id="g")
    sched.add_request(req)
    run = run_to_end(sched, runner)
    outs = []
    for i in range(4):
        alone = dataclasses.replace(req.sampling, n=1, seed=100 + i)
        res = run.results[("g", i)]
        assert (res.tokens, res.finish_reason) == reference(prompt, alone, req.eos_token_id, 256)
        outs.append(tuple(res.tokens))
        lone_sched, lone_runner = make_scheduler(block_size=4)
        lone = make_request(prompt, max_tokens=9, seed=100 + i, temperature=1.0, request_id=f"lone{i}")
        lone_sched.add_request(lone)
        assert run_to_end(lone_sched, lone_runner).results[(f"lone{i}", 0)].tokens == res.tokens
    assert len(set(outs)) > 1, "seeds did not differ"


def test_a_prompt_ending_on_a_block_boundary_needs_no_copy() -> None:
    sched, runner = make_scheduler(block_size=4)
    sched.add_request(make_request(list(range(1, 10)), max_tokens=3, n=2, request_id="b"))  # 9 = 2*4 + 1
    run = Run()
    step(sched, runner, run)
    out = step(sched, runner, run)
    assert out.blocks_to_copy == []
    follower = next(c for c in out.chunks if c.request_id == "b#1")
    assert follower.start_position == 8 and len(follower.block_ids) == 3
    run_to_end(sched, runner, run)


def test_samples_stream_as_choice_indexes_and_abort_together() -> None:
    sched, runner = make_scheduler()
    sched.add_request(make_request(6, max_tokens=20, n=3, ignore_eos=True, request_id="multi"))
    run = Run()
    step(sched, runner, run)
    assert list(run.results) == [("multi", 0)]
    step(sched, runner, run)
    assert sorted(run.results) == [("multi", 0), ("multi", 1), ("multi", 2)]
    deltas = sched.abort_requests(["multi"])
    assert sorted((d.request_id, d.index, d.finish_reason) for d in deltas) == [
        ("multi", i, "abort") for i in range(3)
    ]
    assert not sched.has_unfinished()
    sched.check_invariants()


def test_abort_before_the_fork_reports_pending_samples() -> None:
    sched, _ = make_scheduler()
    sched.add_request(make_request(6, max_tokens=4, n=3, request_id="early"))
    deltas = sched.abort_requests(["early"])
    assert sorted(d.index for d in deltas) == [0, 1, 2]
    assert all(d.num_output_tokens == 0 and d.finish_reason == "abort" for d in deltas)
    sched.check_invariants()


def test_group_waits_for_seats_for_all_its_samples() -> None:
    sched, runner = make_scheduler(max_num_seqs=3)
    sched.add_request(make_request(4, max_tokens=5, ignore_eos=True, request_id="solo"))
    sched.add_request(make_request(4, max_tokens=2, n=3, ignore_eos=True, request_id="trio"))
    run = Run()
    out = step(sched, runner, run)
    assert [c.request_id for c in out.chunks] == ["solo"]  # 1 + 3 seats > 3
    run = run_to_end(sched, runner, run)
    assert sorted(k for k in run.results if k[0] == "trio") == [("trio", 0), ("trio", 1), ("trio", 2)]
