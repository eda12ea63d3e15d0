"""The scheduling part: who computes which tokens each step, and where their KV blocks live.

Pure Python (no torch, no zmq, no numpy: tests/test_architecture.py enforces it), so its logic is
tested fast on any machine. It sees requests as token counts and block ids, never tensors.

    scheduler.py        Scheduler.schedule() -> SchedulerOutput; update(output, result) -> deltas
    step_builder.py     the step being assembled: chunks under a token budget, block moves
    step_cost.py        what steps cost on this host (timed by EngineCore): the serving prefill budget in time
    fair_queue.py       the waiting queue: priority with aging, weighted fair share, arrival
    lora_gate.py        at most --max-loras LoRA adapters running; a refused request is passed over, never starved
    seats.py            --max-num-seqs seats: running requests and the samples their leaders will fork into
    preemption.py       which running request gives its blocks back, and how (swap or recompute)
    sample_group.py     n > 1, best_of: one client request as samples sharing prompt blocks (copy-on-write)
    beam_group.py       beam search: ranking the beams' candidates, finished hypotheses, early stopping
    group_steps.py      the scheduler's steps for sample groups: forks, beam parking and expansion
    stop_conditions.py  the one place a sampled token becomes a finish reason
    request_checks.py   admission: a request that could never run is refused up front
    block_manager.py    block tables on the device and in the CPU pool; prefix-cache hits
    block_pool.py       reference counts, the free list (O(1) LRU), the prefix cache's index
    config.py           SchedulerConfig (the knobs) and SchedulerStats (what it reports)
    counters.py         running totals behind SchedulerStats
    checks.py           the invariant check tests run after every step (a public Placement view)

A step, in order:
  0. (priority policy) an urgent waiting request that cannot fit may preempt running
     requests at least `preemption_priority_gap` levels less urgent;
  1. running requests, most urgent first; when one cannot get blocks, the least
     urgent / cheapest unscheduled request is preempted (swap or recompute);
  2. queued requests: swapped ones (resumed above a free-block watermark) before
     waiting ones of equal or lower urgency; waiting ones in FairQueue order, passing over
     those whose LoRA adapter cannot join (lora_gate.py; the rest of a beam group that runs
     always may). Skipped when step 1 preempted (anti-thrash).

The runner applies a step's block moves before the forward pass, the swap-out first
(or reading every source before writing): a block freed by a swap-out may be the
destination of a copy or a swap-in of the same step. Copies and swap-ins never touch
each other's blocks (copy sources stay held until the next step).
"""
