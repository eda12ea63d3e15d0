"""The scheduler's beam-search steps: parking beams, expanding a group, moving its blocks.

What a beam search decides lives in beam_group.py (pure ranking, no blocks); this is the part
of the scheduler that carries it out on Requests and the block manager: a beam that sampled
parks until its siblings did; then the group expands: continuations append, forks take
pruned beams' slots over a copy-on-write share of their parent's blocks, pruned beams free
theirs, and a finished search sends its best n beams. Preemption takes a beam group whole
(`group_of`). It reaches into the Scheduler it belongs to (one concept split over two files
to keep scheduler.py readable), and like it is pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.outputs import RequestDelta
from engine.request import Request, RequestStatus
from engine.scheduling.beam_group import BeamSearch, NextBeam, plan_slots
from engine.scheduling.sample_group import SampleGroup, SampleState, beam_deltas
from engine.scheduling.step_builder import StepBuilder
from engine.scheduling.stop_conditions import finish_status_after

if TYPE_CHECKING:
    from engine.scheduling.scheduler import Scheduler


class BeamSteps:
    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    def _beam_of(self, req: Request) -> tuple[SampleState, BeamSearch] | None:
        state = self._s._live.get(req.request_id)
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
        bm = self._s.bm
        return sum(bm.num_new_blocks(r, r.num_tokens - r.num_computed_tokens) for r in self._siblings(req)
                   if r in queue and not self.parked(r))

    def queued_reserve(self, req: Request, watermark: int) -> int:
        """Free blocks a queued beam (swapped, or waiting after a recompute) asks for beyond its own
        before it comes back: its queued siblings' too, so the group comes back whole, and the
        watermark; nothing once a sibling runs (the rest of a group that fits must not wait)."""
        siblings = self._siblings(req)
        if any(r.status is RequestStatus.RUNNING for r in siblings):
            return 0
        bm = self._s.bm
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
        max_len = self._s.config.max_model_len

        def stops(slot: int, token: int) -> str | None:
            status = finish_status_after(reqs[slot], token, max_len)
            return None if status is None else status.value

        expansion = beam.expand(outputs, stops)
        if expansion.done:
            results = beam.results(group.num_returned, outputs)
            for req in list(group.live):
                self._s._finish(req, RequestStatus.FINISHED_STOPPED)
            return beam_deltas(group, results)
        self._move(group, beam, expansion.beams, reqs)
        return []

    def _move(self, group: SampleGroup, beam: BeamSearch, beams: list[NextBeam], reqs: dict[int, Request]) -> None:
        """Forks first (they read their parents' tables and tokens), then appends, then prunes."""
        placed, pruned = plan_slots(beams, sorted(reqs))
        bm = self._s.bm
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
            self._s._finish(reqs[slot], RequestStatus.FINISHED_ABORTED)
        beam.scores = {slot: nb.score for slot, nb in placed}

    def _start(self, group: SampleGroup, child: Request, leader: Request) -> None:
        s = self._s
        group.pending.remove(child)
        if not group.pending:
            s._forking.discard(group)
        child.num_cached_tokens = leader.num_cached_tokens
        state = s._live[child.request_id]
        state.level, state.admitted = s._level_of(leader), True
        child.transition(RequestStatus.RUNNING)
        s.running.append(child)
