"""The scheduler: who computes which tokens each step, and who gives memory back.

One rule for every request (vLLM V1): each step moves `num_computed_tokens` toward
`num_tokens` under a token budget, so prefill chunks, prefix-cache hits and decodes
share one step. `num_computed_tokens` is advanced at schedule time (the chunk's KV
is written by that step's forward) and the blocks it fills are registered in the
prefix cache right away, so requests sharing a prompt prefix and admitted in the same
step compute it once. `update` appends the sampled token, forks n > 1 samples and
finishes requests. A finished request's seat is refilled by the very next `schedule()`.
Priorities: a lower value is more urgent (vLLM's convention).

The order of a step and of its block moves: engine/scheduling/__init__.py.

Pure Python: no torch, no zmq. Knows nothing of tensors or text.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.outputs import RequestDelta, RunnerOutput, SchedulerOutput
from engine.request import Request, RequestStatus
from engine.scheduling import sample_group as groups
from engine.scheduling.block_manager import BlockManager, BlockPairs
from engine.scheduling.checks import Placement, check_placement
from engine.scheduling.config import SchedulerConfig, SchedulerStats
from engine.scheduling.counters import Counters
from engine.scheduling.fair_queue import FairQueue, aged_level
from engine.scheduling.group_steps import GroupSteps
from engine.scheduling.lora_gate import LoraGate
from engine.scheduling.preemption import pick_victim, plan_room, preempt_kind, victim_order
from engine.scheduling.request_checks import RequestRejected, validate_request
from engine.scheduling.sample_group import SampleGroup, SampleState, sample_ids, split_samples
from engine.scheduling.seats import Seats
from engine.scheduling.slo import SloPlanner
from engine.scheduling.step_builder import StepBuilder, serving_prefill_budget
from engine.scheduling.step_cost import StepCosts
from engine.scheduling.stop_conditions import finish_status

__all__ = ["RequestRejected", "Scheduler", "SchedulerConfig", "SchedulerStats"]


class Scheduler:
    """Continuous batching over `num_device_blocks` KV blocks of `block_size` tokens, with a
    CPU pool of `num_cpu_blocks` for swapped requests. `clock` (seconds, monotonic) times
    aging; tests pass a fake one. `vocab_size` bounds token ids at admission. Request ids in
    chunks are internal sample ids; deltas carry the client's id and the sample index."""

    def __init__(
        self,
        config: SchedulerConfig,
        num_device_blocks: int,
        num_cpu_blocks: int, block_size: int,
        clock: Callable[[], float] = time.monotonic,
        vocab_size: int | None = None,
    ) -> None:
        self.config = config
        self.vocab_size = vocab_size
        """Token ids of requests are checked against it at admission (None: no model, unchecked)."""
        self.block_size = block_size
        self.bm = BlockManager(num_device_blocks, num_cpu_blocks, block_size, config.enable_prefix_caching)
        self.waiting = FairQueue(config.policy, config.aging_rate)
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.loras = LoraGate(config.max_loras, config.lora_drain_s)
        self._clock = clock
        self._live: dict[str, SampleState] = {}  # internal id -> a live sample's bookkeeping
        self._groups: dict[str, SampleGroup] = {}  # client id -> its samples
        self._forking: set[SampleGroup] = set()  # groups whose samples 1..n-1 are pending
        self._next_seq = 0
        self._finished_ids: list[str] = []
        self._counters = Counters()
        self.step_costs = StepCosts(config.prefill_stall_factor, config.prefill_backlog_drain_s)  # EngineCore feeds it
        self.slo = SloPlanner(config.ttft_target_s, config.itl_target_s, config.ttft_stall_limit)  # slo.py
        self.groups = GroupSteps(self.bm, self._live, self.running, self._forking, self._finish, self._level_of,
                                 config.max_model_len)
        self.seats = Seats(config.max_num_seqs, self.running, self._live, self._forking)

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        """Queue a request; n > 1 is split into n samples sharing the prompt's blocks."""
        ids = sample_ids(req)
        if req.request_id in self._groups or any(i in self._live for i in ids):
            raise RequestRejected(f"request id {req.request_id!r} is already in use")
        validate_request(req, self.config, self.bm.blocks_for, self.bm.device.num_blocks, self.vocab_size)
        group = split_samples(req)
        now = self._clock()
        self._groups[group.client_id] = group
        if group.pending:
            self._forking.add(group)
        for i, sample in enumerate(group.samples):
            self._live[sample.request_id] = SampleState(sample, group, i, self._next_seq, now)
            self._next_seq += 1
        self.waiting.push(group.leader, self._seq_of(group.leader), now)
        self.step_costs.note_arrival(now, req.num_prompt_tokens)

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        """Abort client requests (every sample); unknown or finished ids are ignored."""
        deltas = []
        for client_id in request_ids:
            group = self._groups.get(client_id)
            if group is None:
                continue
            aborted = group.live
            for sample in aborted:
                self._finish(sample, RequestStatus.FINISHED_ABORTED)
            deltas += groups.abort_deltas(group, aborted)
        return deltas

    def fail_step(self, out: SchedulerOutput) -> list[str]:
        """A step's execution failed: abort every request it scheduled and return their client ids.
        The KV its forward should have written is untrusted, so cached blocks nobody holds are
        forgotten too (blocks registered in this step are held only by requests of this step)."""
        client_ids = sorted({self._live[c.request_id].group.client_id for c in out.chunks
                             if c.request_id in self._live})
        self.abort_requests(client_ids)
        self.bm.end_step()
        self.bm.device.forget_free_cached()
        return client_ids

    def has_unfinished(self) -> bool:
        return bool(self._live)

    # -- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        now = self._clock()
        self.bm.end_step()
        self.loras.begin_step(self.running, now)
        step = StepBuilder(budget=self.config.max_num_batched_tokens, chunk_cap=self.config.long_prefill_token_threshold,
                           prefill_budget=serving_prefill_budget(self.config, self.running, self.waiting,
                                                                 self.step_costs, now, self._live, self.slo))
        if self.config.policy == "priority":
            self._preempt_for_urgent(now, step)
        if not self._schedule_running(step):
            self._schedule_queued(now, step)
        out = step.build(self._finished_ids)
        self._finished_ids = []
        self._counters.end_step(len(step.chunks), out.num_tokens)
        return out

    def update(self, out: SchedulerOutput, runner_output: RunnerOutput) -> list[RequestDelta]:
        """Append sampled tokens, fork pending samples, finish stopped requests."""
        self.bm.end_step()  # the runner has applied this step's moves
        deltas = []
        for chunk in out.chunks:
            state = self._live.get(chunk.request_id)
            if state is None or state.req.status is not RequestStatus.RUNNING:
                continue  # aborted since schedule()
            req = state.req
            if not chunk.sample:
                continue
            if state.group.beam is not None:
                deltas += self.groups.report(state, runner_output.beam_candidates.get(chunk.request_id))
                continue
            token = runner_output.sampled_token_ids.get(chunk.request_id)
            if token is None:
                raise RuntimeError(f"the runner sampled no token for {chunk.request_id}")
            req.output_token_ids.append(token)
            self.groups.fork_pending(state)
            status = finish_status(req, self.config.max_model_len)
            if status is not None:
                self._finish(req, status)
            deltas += groups.token_deltas(state, token, runner_output.logprobs.get(chunk.request_id))
        return deltas

    def _schedule_running(self, step: StepBuilder) -> bool:
        """Give each running request its next chunk, preempting when blocks run out.
        Returns whether anything was preempted for memory."""
        preempted = False
        queue = sorted(self.running, key=self._urgency)
        while queue and step.budget > 0:
            req = queue.pop(0)
            if self.groups.parked(req):
                continue  # its candidates wait for its sibling beams'
            num_new = self._num_new_tokens(req, 0, step)
            if num_new == 0:
                continue  # a prompt chunk over the serving prefill budget: next step
            copies = self.bm.allocate(req, num_new, reserve=self.groups.sibling_blocks(req, queue))
            while copies is None:
                victim = pick_victim(queue, self._level_of, self._seq_of) or req
                gone = self._preempt(victim, step, urgent=False)
                queue = [r for r in queue if r not in gone]
                preempted = True
                if req in gone:
                    break
                copies = self.bm.allocate(req, num_new, reserve=self.groups.sibling_blocks(req, queue))
            if copies is not None:
                self._emit(req, num_new, copies, step)
        return preempted

    def _schedule_queued(self, now: float, step: StepBuilder) -> None:
        """Resume swapped requests and admit waiting ones, most urgent first."""
        while step.budget > 0:
            swapped = min((r for r in self.swapped if self._may_join(r)),
                          key=lambda r: (self._queued_level(r, now), self._seq_of(r)), default=None)
            waiting = self.waiting.peek(now, self._may_join)
            if swapped is not None and (waiting is None or self._resume_first(swapped, waiting, now)):
                if not self.seats.available_for(swapped) or not self._resume(swapped, step):
                    return
            elif waiting is not None:
                if not self.seats.available_for(waiting) or not self._admit(waiting, step):
                    return
            else:
                return

    def _may_join(self, req: Request) -> bool:
        """The LoRA gate's rule, except for a beam whose group already runs: it must come back
        (its parked siblings wait for it), so a drain never splits a group it would then wait on."""
        return self.groups.rejoins(req) or self.loras.admits(req)

    def _resume_first(self, swapped: Request, waiting: Request, now: float) -> bool:
        if self.config.policy != "priority":
            return self._seq_of(swapped) <= self._seq_of(waiting)
        return self._queued_level(swapped, now) <= self.waiting.level(waiting, now)

    def _resume(self, req: Request, step: StepBuilder) -> bool:
        parked = self.groups.parked(req)  # its KV is complete: it comes back to wait for its siblings
        num_new = 0 if parked else self._num_new_tokens(req, 0, step)
        if num_new == 0 and not parked:
            return False
        after = self.bm.blocks_for(req.num_computed_tokens + num_new) - self.bm.num_swapped_blocks(req)
        watermark = self._watermark(self.config.swap_in_watermark)
        pairs = self.bm.swap_in(req, reserve=after + self.groups.queued_reserve(req, watermark))
        if pairs is None:
            return False
        copies = self.bm.allocate(req, num_new)
        assert copies == [], "swap-in reserved the chunk's blocks"
        step.swap_in += pairs
        self._live[req.request_id].level = self._queued_level(req, self._clock())
        self.swapped.remove(req)
        req.transition(RequestStatus.RUNNING)
        self.running.append(req)
        self.loras.joined(req)
        self._counters.swapped_in(len(pairs))
        if num_new:
            self._emit(req, num_new, copies, step)
        return True

    def _admit(self, req: Request, step: StepBuilder) -> bool:
        hit = self.bm.find_prefix(req)
        num_new = self._num_new_tokens(req, hit.num_tokens, step)
        if num_new == 0:
            return False
        watermark = self._watermark(self.config.admission_watermark)
        copies = self.bm.allocate(req, num_new, hit, reserve=self.groups.queued_reserve(req, watermark))
        if copies is None:
            return False
        state, now = self._live[req.request_id], self._clock()
        state.level = self.waiting.level(req, now)
        self.waiting.admit(req)
        req.num_computed_tokens = hit.num_tokens
        state.on_admitted(hit.num_tokens, now)
        self._counters.prefix_lookup(hit.num_tokens, req.num_tokens)
        req.transition(RequestStatus.RUNNING)
        self.running.append(req)
        self.loras.joined(req)
        self._emit(req, num_new, copies, step)
        return True

    def _emit(self, req: Request, num_new: int, copies: BlockPairs, step: StepBuilder) -> None:
        step.add_chunk(req, num_new, copies)
        # Findable at once: a request admitted later in this step may hit these blocks, and
        # reads them after this step's KV write (the runner writes every chunk's KV first).
        self.bm.cache_full_blocks(req)
        self.waiting.charge(req, num_new)

    def _num_new_tokens(self, req: Request, num_cached: int, step: StepBuilder) -> int:
        """The request's next chunk under the step's budgets; 0 only when the serving prefill
        budget is spent (the request has tokens left and the step budget room)."""
        left = req.num_tokens - req.num_computed_tokens - num_cached
        assert left > 0 and step.budget > 0, f"{req.request_id} has nothing to compute"
        return step.room(req, left, num_cached)

    # -- preemption ----------------------------------------------------------------------

    def _preempt(self, victim: Request, step: StepBuilder, urgent: bool) -> list[Request]:
        """Preempt the victim and, for a beam, its group (GroupSteps.group_of). Returns who left."""
        group = self.groups.group_of(victim, step)
        kind = preempt_kind(self.config, sum(self.bm.num_held(r) for r in group),
                            sum(r.num_computed_tokens for r in group), self.bm.num_free_cpu_blocks)
        for req in group:
            self.running.remove(req)
            pairs = self.bm.swap_out(req) if kind == "swap" else None
            if pairs is not None:
                step.swap_out += pairs
                req.transition(RequestStatus.SWAPPED)
                self.swapped.append(req)
            else:
                self.bm.free(req, forget=False)
                req.num_computed_tokens = 0
                self.groups.unpark(req)  # it will compute its candidates again
                req.transition(RequestStatus.WAITING)
                state = self._live[req.request_id]
                self.waiting.push(req, state.seq, state.enqueued_at)
            self._counters.preempted(pairs, urgent)
        return group

    def _preempt_for_urgent(self, now: float, step: StepBuilder) -> None:
        """Make room for the head of the queue by preempting requests far less urgent."""
        req = self.waiting.peek(now, self.loras.admits)
        if req is None:
            return
        # The head's static priority: aging orders the queue but never makes a request preempt.
        gap = self.config.preemption_priority_gap
        candidates = [r for r in self.running if self._level_of(r) - req.priority >= gap]
        if not candidates:
            return
        hit = self.bm.find_prefix(req)
        num_new = self._num_new_tokens(req, hit.num_tokens, step)
        if num_new == 0:
            return
        growth = sum(self.bm.blocks_for(r.num_tokens) - self.bm.num_held(r) for r in self.running)
        short_blocks = (
            self.bm.num_new_blocks(req, num_new, hit)
            + growth
            + self._watermark(self.config.admission_watermark)
            - self.bm.num_free_device_blocks
        )
        short_seats = self.seats.needed(req) - self.seats.free()
        if short_blocks <= 0 and short_seats <= 0:
            return
        candidates.sort(key=victim_order(self._level_of, self._seq_of))
        for victim in plan_room(candidates, short_blocks, short_seats, self._room_freed_by):
            if victim.status is RequestStatus.RUNNING:  # else it left with its beam group
                self._preempt(victim, step, urgent=True)

    def _room_freed_by(self, victim: Request) -> tuple[int, int]:
        """(blocks, seats) preempting `victim` makes available, its own growth included."""
        growth = self.bm.blocks_for(victim.num_tokens) - self.bm.num_held(victim)
        return self.bm.num_reclaimable(victim) + growth, self.seats.needed(victim)

    def _watermark(self, fraction: float) -> int:
        # A lone request must always fit, or it would wait forever for memory nobody holds.
        return int(fraction * self.bm.device.num_blocks) if self.running else 0

    def _seq_of(self, req: Request) -> int:
        return self._live[req.request_id].seq

    def _urgency(self, req: Request) -> tuple[int, int]:
        return (self._level_of(req), self._seq_of(req))

    def _level_of(self, req: Request) -> int:
        """A request's urgency level once admitted: its priority, improved by the aging it
        had when it was admitted or resumed (so an aged request is not preempted at once)."""
        if self.config.policy != "priority":
            return 0
        level = self._live[req.request_id].level
        return req.priority if level is None else level

    def _queued_level(self, req: Request, now: float) -> int:
        if self.config.policy != "priority":
            return 0
        enqueued_at = self._live[req.request_id].enqueued_at
        return aged_level(req.priority, enqueued_at, now, self.config.aging_rate)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        rid = req.request_id
        group = self._live.pop(rid).group
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.SWAPPED:
            self.swapped.remove(req)
        elif not self.waiting.remove(req):
            group.pending.remove(req)
        req.transition(status)
        self.loras.forget(req)
        self.bm.free(req)
        self._finished_ids.append(rid)
        if not group.live:
            del self._groups[group.client_id]
            self._forking.discard(group)

    # -- observability -------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        pending = sum(len(g.pending) for g in self._groups.values())
        return self._counters.snapshot(running=len(self.running), waiting=len(self.waiting) + pending,
                                       swapped=len(self.swapped), bm=self.bm)

    def placement(self) -> Placement:
        return Placement(
            live=[state.req for state in self._live.values()], running=list(self.running),
            swapped=list(self.swapped), queued=list(self.waiting),
            pending=[r for g in self._groups.values() for r in g.pending],
            seats_taken=self.seats.taken(),
            groups_without_live_sample=[g.client_id for g in self._groups.values() if not g.live],
            bm=self.bm, max_num_seqs=self.config.max_num_seqs, max_model_len=self.config.max_model_len,
        )

    def check_invariants(self) -> None:
        """Assert block accounting and every request's state agree (tests call it every step)."""
        check_placement(self.placement())
