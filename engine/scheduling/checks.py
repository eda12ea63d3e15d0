"""The scheduler's invariant check: every request is in exactly one place, in the right state,
holding exactly the blocks that cover its computed tokens. Tests call it after every step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import RequestStatus

if TYPE_CHECKING:
    from engine.scheduling.scheduler import Scheduler


def check_scheduler(s: Scheduler) -> None:
    live = [state.req for state in s._live.values()]
    s.bm.check(live)
    pending = [r for g in s._groups.values() for r in g.pending]
    queued = list(s.waiting)
    places = len(s.running) + len(s.swapped) + len(queued) + len(pending)
    assert places == len(live), f"{places} placed requests, {len(live)} live"
    assert {r.request_id for r in s.running + s.swapped + queued + pending} == set(s._live)
    assert len(s.running) + sum(s._pending_count(r) for r in s.running) <= s.config.max_num_seqs
    for req in live:
        assert req.num_computed_tokens <= req.num_tokens <= s.config.max_model_len
    for req in s.running:
        assert req.status is RequestStatus.RUNNING
        need = s.bm.blocks_for(req.num_computed_tokens)
        assert len(req.block_ids) == need, f"{req.request_id}: {len(req.block_ids)} blocks for {need}"
    for req in s.swapped:
        assert req.status is RequestStatus.SWAPPED and not req.block_ids
        assert s.bm.num_swapped_blocks(req) == s.bm.blocks_for(req.num_computed_tokens)
    for req in queued + pending:
        assert req.status is RequestStatus.WAITING and not req.block_ids
        assert req.num_computed_tokens == 0
    for group in s._groups.values():
        assert group.live, f"group {group.client_id} has no live sample"
