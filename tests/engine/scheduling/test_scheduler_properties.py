"""Property tests: random add / step / abort workloads on tiny block budgets.

After every step the invariant check holds (no leak, no double free, reference
counts match the block tables); every request finishes or is aborted; and every
greedy or seeded sample equals what it produces alone with unlimited memory, under
swap, recompute and cost-based preemption, with prefix caching, forks and aborts.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.scheduling.scheduler import RequestRejected
from tests.engine.scheduling.fakes import EOS, FakeClock, Run, make_request, make_scheduler, reference, step

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

request_spec = st.fixed_dictionaries(
    {
        "prompt_len": st.integers(1, 14),
        "shared_prefix": st.integers(0, 8),
        "max_tokens": st.integers(1, 12),
        "priority": st.integers(0, 2),
        "tenant": st.sampled_from(["a", "b"]),
        "n": st.integers(1, 3),
        "seeded": st.booleans(),
        "min_tokens": st.integers(0, 2),
        "stop": st.booleans(),
        "ignore_eos": st.booleans(),
        "arrival": st.integers(0, 6),
        "abort_at": st.one_of(st.none(), st.integers(0, 30)),
    }
)


def build(i: int, spec: dict, common: list[int]):  # type: ignore[no-untyped-def]
    own = make_request(spec["prompt_len"], request_id=f"q{i}").prompt_token_ids
    prompt = (common[: spec["shared_prefix"]] + own)[: max(spec["prompt_len"], 1)]
    return make_request(
        prompt,
        max_tokens=spec["max_tokens"],
        request_id=f"q{i}",
        priority=spec["priority"],
        tenant_id=spec["tenant"],
        cache_salt=spec["tenant"],
        n=spec["n"],
        temperature=0.8 if spec["seeded"] else 0.0,
        seed=1000 + i if spec["seeded"] else None,
        min_tokens=min(spec["min_tokens"], spec["max_tokens"]),
        stop_token_ids=(5, 9) if spec["stop"] else (),
        ignore_eos=spec["ignore_eos"],
    )


def check_workload(specs: list[dict], mode: str, data: st.DataObject) -> None:
    bs = data.draw(st.sampled_from([2, 4]), label="block_size")
    config = dict(
        max_num_seqs=data.draw(st.integers(2, 6)),
        max_num_batched_tokens=data.draw(st.integers(1, 12)),
        max_model_len=data.draw(st.integers(10, 28)),
        preemption_mode=mode,
        enable_prefix_caching=data.draw(st.booleans()),
        policy=data.draw(st.sampled_from(["priority", "fcfs"])),
        long_prefill_token_threshold=data.draw(st.sampled_from([0, 3])),
        swap_in_watermark=0.1,
    )
    common = make_request(8, request_id="common").prompt_token_ids
    reqs = [build(i, s, common) for i, s in enumerate(specs)]
    # Just enough blocks for the largest request alone, plus a few: memory is always short.
    longest = max(min(r.num_prompt_tokens + r.sampling.max_tokens, config["max_model_len"]) for r in reqs)
    num_blocks = -(-longest // bs) + data.draw(st.integers(0, 4), label="spare_blocks")
    clock = FakeClock()
    sched, runner = make_scheduler(num_blocks, data.draw(st.integers(0, 8)), bs, clock=clock, **config)
    runner.copy_last = data.draw(st.booleans(), label="copies after swap-ins")
    accepted, aborted, run = {}, set(), Run()
    for t in range(2000):
        for req, spec in zip(reqs, specs, strict=True):
            if spec["arrival"] == t:
                try:
                    sched.add_request(req)
                    accepted[req.request_id] = req
                except RequestRejected:
                    assert (
                        req.num_prompt_tokens >= sched.config.max_model_len
                        or req.sampling.n > (sched.config.max_num_seqs)
                        or sched.bm.blocks_for(
                            min(req.num_prompt_tokens + req.sampling.max_tokens, sched.config.max_model_len)
                            - 1
                        )
                        > num_blocks
                    )
            if spec["abort_at"] == t and req.request_id in accepted:
                for d in sched.abort_requests([req.request_id]):
                    run.record([d], run.steps)
                aborted.add(req.request_id)
        if t > max(s["arrival"] for s in specs) and not sched.has_unfinished():
            break
        out = step(sched, runner, run)
        assert out.num_tokens <= config["max_num_batched_tokens"]
        assert len(out.chunks) <= config["max_num_seqs"]
        clock.now += 0.5
    assert not sched.has_unfinished(), "the workload did not drain"
    stats = sched.stats()
    assert stats.free_device_blocks == num_blocks and stats.free_cpu_blocks == stats.total_cpu_blocks
    for rid, req in accepted.items():
        for i in range(req.sampling.n):
            res = run.results[(rid, i)]
            seed = None if req.sampling.seed is None else req.sampling.seed + i
            sampling = dataclasses.replace(req.sampling, n=1, seed=seed)
            want, reason = reference(req.prompt_token_ids, sampling, EOS, sched.config.max_model_len)
            if res.finish_reason == "abort":
                assert rid in aborted and res.tokens == want[: len(res.tokens)]
            else:
                assert (res.tokens, res.finish_reason) == (want, reason), f"{rid}#{i}"


@SETTINGS
@given(specs=st.lists(request_spec, min_size=2, max_size=10), data=st.data())
def test_random_workloads_swap(specs: list[dict], data: st.DataObject) -> None:
    check_workload(specs, "swap", data)


@SETTINGS
@given(specs=st.lists(request_spec, min_size=2, max_size=10), data=st.data())
def test_random_workloads_recompute(specs: list[dict], data: st.DataObject) -> None:
    check_workload(specs, "recompute", data)


@SETTINGS
@given(specs=st.lists(request_spec, min_size=2, max_size=10), data=st.data())
def test_random_workloads_auto(specs: list[dict], data: st.DataObject) -> None:
    check_workload(specs, "auto", data)
