"""The scheduler's steps for groups of samples: n > 1 forks, and beam search's parking,
expansion and block moves.

n > 1: once the leader's prompt KV is written, its pending samples fork it (`fork_pending`).

What a beam search decides lives in beam_group.py (pure ranking, no blocks); this is the part
of the scheduler that carries it out on Requests and the block manager: a beam that sampled
parks until its siblings did; then the group expands: continuations append, forks take
pruned beams' slots over a copy-on-write share of their parent's blocks, pruned beams free
theirs, and a finished search sends its best n beams. Preemption takes a beam group whole
(`group_of`). The Scheduler builds it over its own collections (one concept split over two
files to keep scheduler.py readable); pure Python like it.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.outputs import RequestDelta
from engine.request import Request, RequestStatus
from engine.scheduling.beam_group import BeamSearch, NextBeam, plan_slots
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.sample_group import SampleGroup, SampleState, beam_deltas
from engine.scheduling.step_builder import StepBuilder
from engine.scheduling.stop_conditions import finish_status_after


class GroupSteps:
    """Shares the scheduler's own collections (it is built by the Scheduler, over its fields)."""

    def __init__(self, bm: BlockManager, live: dict[str, SampleState], running: list[Request],
                 forking: set[SampleGroup], finish: Callable[[Request, RequestStatus], None],
                 level_of: Callable[[Request], int], max_model_len: int) -> None:
        self._bm, self._live, self._running, self._forking = bm, live, running, forking
        self._finish, self._level_of, self._max_model_len = finish, level_of, max_model_len

    def _beam_of(self, req: Request) -> tuple[SampleState, BeamSearch] | None:
        state = self._live.get(req.request_id)
        if state is None or state.group.beam is None:
            return None
        return state, state.group.beam

    def parked(self, req: Request) -> bool:
        """Sampled already: waits, computing nothing, for its siblings' candidates."""
        found = self._beam_of(req)
        return found is not None and found[1].parked(found[0].index)

    def unpark(self, req: Request) -> None:
        """It lost its KV (recomputed): it will report its candidates again."""
        found = self._beam_of(req)
        if found is not None:
            found[1].candidates.pop(found[0].index, None)

    def group_of(self, victim: Request, step: StepBuilder) -> list[Request]:
        """Who leaves with a preempted request: itself, and if it is a beam, its running siblings
        that this step has not scheduled (those that did park after it and follow later)."""
        found = self._beam_of(victim)
        if found is None:
            return [victim]
        in_step = {c.request_id for c in step.chunks}
        return [victim] + [r for r in found[0].group.live if r is not victim
                           and r.status is RequestStatus.RUNNING and r.request_id not in in_step]

    def rejoins(self, req: Request) -> bool:
        """A queued beam whose group has a beam running: the rest of a group that runs is not a
        new request (the LoRA gate must let it back, as the group's adapter already runs)."""
        return any(r.status is RequestStatus.RUNNING for r in self._siblings(req))

    def _siblings(self, req: Request) -> list[Request]:
        """The beam's live siblings that exist on their own (pending beams only fork, later)."""
        found = self._beam_of(req)
        if found is None:
            return []
        group = found[0].group
        return [r for r in group.live if r is not req and r not in group.pending]

    def sibling_blocks(self, req: Request, queue: list[Request]) -> int:
        """Blocks the beam's siblings still to be scheduled this step need: reserved when the first
        of a group allocates, so the group runs whole or leaves whole (never half parked)."""
        bm = self._bm
        return sum(bm.num_new_blocks(r, r.num_tokens - r.num_computed_tokens) for r in self._siblings(req)
                   if r in queue and not self.parked(r))

    def queued_reserve(self, req: Request, watermark: int) -> int:
        """Free blocks a queued request (swapped, or waiting) asks for beyond its own before it runs:
        the watermark; for a beam, its queued siblings' too, so the group comes back whole, and
        nothing once a sibling runs (the rest of a group that fits must not wait)."""
        if self._beam_of(req) is None:
            return watermark
        siblings = self._siblings(req)
        if any(r.status is RequestStatus.RUNNING for r in siblings):
            return 0
        bm = self._bm
        return watermark + sum(bm.blocks_for(r.num_computed_tokens + 1) if r.status is RequestStatus.SWAPPED
                               else bm.blocks_for(r.num_tokens) for r in siblings)

    def report(self, state: SampleState, candidates: list[tuple[int, float]] | None) -> list[RequestDelta]:
        """A beam's candidates arrived; the last of its group's expands the search."""
        group, beam = state.group, state.group.beam
        assert beam is not None
        if candidates is None:
            raise RuntimeError(f"the runner returned no beam candidates for {state.req.request_id}")
        beam.candidates[state.index] = candidates
        if not beam.ready():
            return []
        reqs = {i: s for i, s in enumerate(group.samples) if s in group.live}
        outputs = {i: reqs[i].output_token_ids for i in beam.scores}
        max_len = self._max_model_len

        def stops(slot: int, token: int) -> str | None:
            status = finish_status_after(reqs[slot], token, max_len)
            return None if status is None else status.value

        expansion = beam.expand(outputs, stops)
        if expansion.done:
            results = beam.results(group.num_returned, outputs)
            for req in list(group.live):
                self._finish(req, RequestStatus.FINISHED_STOPPED)
            return beam_deltas(group, results)
        self._move(group, beam, expansion.beams, reqs)
        return []

    def _move(self, group: SampleGroup, beam: BeamSearch, beams: list[NextBeam], reqs: dict[int, Request]) -> None:
        """Forks first (they read their parents' tables and tokens), then appends, then prunes."""
        placed, pruned = plan_slots(beams, sorted(reqs))
        bm = self._bm
        for slot, nb in placed:
            if slot == nb.parent:
                continue
            child, parent = reqs[slot], reqs[nb.parent]
            bm.free(child)
            bm.fork(parent, child, parent.num_computed_tokens)
            child.output_token_ids = [*parent.output_token_ids, nb.token]
            child.num_computed_tokens = parent.num_computed_tokens
            if child in group.pending:  # the first expansion starts the waiting beams
                self._start(group, child, parent)
        for slot, nb in placed:
            if slot == nb.parent:
                reqs[slot].output_token_ids.append(nb.token)
        for slot in pruned:
            self._finish(reqs[slot], RequestStatus.FINISHED_ABORTED)
        beam.scores = {slot: nb.score for slot, nb in placed}

    def fork_pending(self, state: SampleState) -> None:
        """n > 1: the leader's prompt KV is written: the pending samples share it and start."""
        leader, group = state.req, state.group
        if state.index != 0 or not group.pending:
            return
        shared = leader.num_prompt_tokens - 1
        for follower in list(group.pending):
            self._bm.fork(leader, follower, shared)
            follower.num_computed_tokens = shared
            self._start(group, follower, leader)

    def _start(self, group: SampleGroup, child: Request, leader: Request) -> None:
        group.pending.remove(child)
        if not group.pending:
            self._forking.discard(group)
        child.num_cached_tokens = leader.num_cached_tokens
        state = self._live[child.request_id]
        state.level, state.admitted = self._level_of(leader), True
        child.transition(RequestStatus.RUNNING)
        self._running.append(child)
