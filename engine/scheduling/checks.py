"""The scheduler's invariant check: every request is in exactly one place, in the right state,
holding exactly the blocks that cover its computed tokens. Tests call it after every step.

It reads a `Placement`, the scheduler's public view of where its requests are, never the
scheduler's private fields: the scheduler builds the view and calls `check_placement`, so this
module does not import the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request, RequestStatus
from engine.scheduling.block_manager import BlockManager


@dataclass(frozen=True)
class Placement:
    """Where every live request is, as the scheduler sees it."""

    live: list[Request]
    running: list[Request]
    swapped: list[Request]
    queued: list[Request]
    pending: list[Request]
    """Samples of n>1 requests that have not forked yet."""
    seats_taken: int
    """Running requests plus the pending samples they will fork into."""
    groups_without_live_sample: list[str]
    bm: BlockManager
    max_num_seqs: int
    max_model_len: int


def check_placement(p: Placement) -> None:
    p.bm.check(p.live)
    places = len(p.running) + len(p.swapped) + len(p.queued) + len(p.pending)
    assert places == len(p.live), f"{places} placed requests, {len(p.live)} live"
    placed = {r.request_id for r in p.running + p.swapped + p.queued + p.pending}
    assert placed == {r.request_id for r in p.live}
    assert p.seats_taken <= p.max_num_seqs
    for req in p.live:
        assert req.num_computed_tokens <= req.num_tokens <= p.max_model_len
    for req in p.running:
        assert req.status is RequestStatus.RUNNING
        need = p.bm.blocks_for(req.num_computed_tokens)
        assert len(req.block_ids) == need, f"{req.request_id}: {len(req.block_ids)} blocks for {need}"
    for req in p.swapped:
        assert req.status is RequestStatus.SWAPPED and not req.block_ids
        assert p.bm.num_swapped_blocks(req) == p.bm.blocks_for(req.num_computed_tokens)
    for req in p.queued + p.pending:
        assert req.status is RequestStatus.WAITING and not req.block_ids
        assert req.num_computed_tokens == 0
    assert not p.groups_without_live_sample, f"groups with no live sample: {p.groups_without_live_sample}"
