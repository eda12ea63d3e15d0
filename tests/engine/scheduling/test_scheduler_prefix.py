"""Automatic prefix caching through the scheduler: hits are exact, salted per tenant, LRU-evicted."""

from __future__ import annotations

from tests.engine.scheduling.fakes import Run, make_request, make_scheduler, reference, run_to_end, step

SYSTEM = [3 + (i * 7) % 50 for i in range(12)]  # a shared 12-token "system prompt"


def output(run: Run, req) -> list[int]:  # type: ignore[no-untyped-def]
    return run.results[(req.request_id, 0)].tokens


def test_a_hit_and_a_miss_produce_identical_output() -> None:
    outs = {}
    for caching in (True, False):
        sched, runner = make_scheduler(enable_prefix_caching=caching)
        first = make_request(SYSTEM + [60, 61], max_tokens=6, request_id="first", ignore_eos=True)
        second = make_request(SYSTEM + [62, 63, 1], max_tokens=6, request_id="second", ignore_eos=True)
        sched.add_request(first)
        run = run_to_end(sched, runner)
        sched.add_request(second)
        run = run_to_end(sched, runner, run)
        outs[caching] = (output(run, first), output(run, second))
        cached = run.results[("second", 0)].num_cached_tokens
        assert cached == (12 if caching else 0)
        assert sched.stats().prefix_cache_hit_tokens == cached
    assert outs[True] == outs[False]
    want = reference(SYSTEM + [62, 63, 1], make_request(1, max_tokens=6, ignore_eos=True).sampling, 0, 256)
    assert outs[True][1] == want[0]


def test_a_running_requests_blocks_are_shared_while_it_runs() -> None:
    sched, runner = make_scheduler(block_size=4)
    first = make_request(SYSTEM + [60], max_tokens=10, ignore_eos=True)
    sched.add_request(first)
    run = Run()
    step(sched, runner, run)  # first's prompt KV is written and its full blocks registered
    second = make_request(SYSTEM + [61], max_tokens=3, ignore_eos=True)
    sched.add_request(second)
    out = step(sched, runner, run)
    chunk = next(c for c in out.chunks if c.request_id == second.request_id)
    assert chunk.start_position == 12 and chunk.block_ids[:3] == first.block_ids[:3]
    assert [sched.bm.device.blocks[b].ref_cnt for b in chunk.block_ids[:3]] == [2, 2, 2]
    run = run_to_end(sched, runner, run)
    assert run.results[(second.request_id, 0)].num_cached_tokens == 12


def test_the_last_prompt_token_is_always_computed() -> None:
    sched, runner = make_scheduler(block_size=4)
    prompt = SYSTEM[:8]
    for rid in ("a", "b"):
        sched.add_request(make_request(prompt, max_tokens=2, request_id=rid, ignore_eos=True))
        run = run_to_end(sched, runner)
    # 8 tokens, 2 full blocks cached: only the first is a hit, the second is recomputed.
    assert run.results[("b", 0)].num_cached_tokens == 4
    assert run.outputs[0].chunks[0].token_ids == prompt[4:]


def test_two_tenants_with_the_same_prompt_share_nothing() -> None:
    sched, runner = make_scheduler()
    a = make_request(SYSTEM + [60], max_tokens=4, tenant_id="a", cache_salt="salt-a", ignore_eos=True)
    b = make_request(SYSTEM + [60], max_tokens=4, tenant_id="b", cache_salt="salt-b", ignore_eos=True)
    sched.add_request(a)
    run = Run()
    step(sched, runner, run)
    sched.add_request(b)
    step(sched, runner, run)
    assert not set(a.block_ids) & set(b.block_ids)
    run = run_to_end(sched, runner, run)
    assert run.results[(b.request_id, 0)].num_cached_tokens == 0
    assert sched.stats().prefix_cache_hit_tokens == 0
    assert output(run, a) == output(run, b)
    # The same salt (a tenant's, or a shared global pool) does hit.
    c = make_request(SYSTEM + [61], max_tokens=2, cache_salt="salt-b", ignore_eos=True)
    sched.add_request(c)
    run = run_to_end(sched, runner, run)
    assert run.results[(c.request_id, 0)].num_cached_tokens == 12


def test_freed_cached_blocks_are_evicted_least_recently_used_first() -> None:
    # 8 blocks of 4: two 9-token prompts leave 2 + 2 cached blocks after they finish.
    sched, runner = make_scheduler(num_device_blocks=8, block_size=4)
    old = [10 + i for i in range(8)] + [1]
    new = [30 + i for i in range(8)] + [1]
    for prompt in (old, new):
        sched.add_request(make_request(prompt, max_tokens=1))
        run_to_end(sched, runner)
    assert sched.stats().cached_blocks == 4
    # A request needing 6 fresh blocks: 4 are free, so the 2 least recently freed
    # (old's) are evicted and new's stay findable.
    sched.add_request(make_request(21, max_tokens=1, request_id="filler"))
    run_to_end(sched, runner)
    probe_new = make_request(new[:8] + [2], max_tokens=1, request_id="probe-new")
    probe_old = make_request(old[:8] + [2], max_tokens=1, request_id="probe-old")
    sched.add_request(probe_new)
    sched.add_request(probe_old)
    run = run_to_end(sched, runner)
    assert run.results[("probe-new", 0)].num_cached_tokens == 8
    assert run.results[("probe-old", 0)].num_cached_tokens == 0


def test_recompute_after_preemption_hits_the_cache() -> None:
    sched, runner = make_scheduler(num_device_blocks=6, num_cpu_blocks=0, block_size=4, max_num_seqs=2)
    a = make_request(9, max_tokens=12, ignore_eos=True, request_id="a")
    b = make_request(9, max_tokens=12, ignore_eos=True, request_id="b")
    sched.add_request(a)
    sched.add_request(b)
    run = run_to_end(sched, runner)
    stats = sched.stats()
    assert stats.recomputes >= 1 and stats.prefix_cache_hit_tokens > 0
    for r in (a, b):
        assert output(run, r) == reference(r.prompt_token_ids, r.sampling, 0, 256)[0]
        assert run.results[(r.request_id, 0)].num_cached_tokens == 0  # reported at first admission


def test_requests_admitted_in_the_same_step_compute_a_shared_prefix_once() -> None:
    sched, runner = make_scheduler(block_size=4, max_num_batched_tokens=64)
    reqs = [make_request(SYSTEM + [60 + i], max_tokens=3, ignore_eos=True) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    run = Run()
    first = step(sched, runner, run)
    assert [len(c.token_ids) for c in first.chunks] == [13, 1, 1, 1]
    assert all(c.block_ids[:3] == first.chunks[0].block_ids[:3] for c in first.chunks)
    run = run_to_end(sched, runner, run)
    for r in reqs:
        assert output(run, r) == reference(r.prompt_token_ids, r.sampling, 0, 256)[0]
    assert [run.results[(r.request_id, 0)].num_cached_tokens for r in reqs] == [0, 12, 12, 12]
