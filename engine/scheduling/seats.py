"""Seats: `max_num_seqs` bounds the sequences that run at once, the forks still to come included.

    running: [ L0  x  y ]   L0 leads n=3 samples; L1, L2 pending on its prompt   max_num_seqs 6
    seats taken: 3 running + 2 held for L1, L2 = 5      free: 1

A leader's pending samples (n > 1, best_of, beams) fork it once its prompt KV is written
(GroupSteps.fork_pending) and join the batch without admission: their seats are held from the
leader's admission, so a fork never finds the batch full. Admission, resuming and preemption for
an urgent request all count seats here. Shares the scheduler's collections; pure Python.
"""

from __future__ import annotations

from engine.request import Request, RequestStatus
from engine.scheduling.sample_group import SampleGroup, SampleState


class Seats:
    def __init__(self, max_num_seqs: int, running: list[Request], live: dict[str, SampleState],
                 forking: set[SampleGroup]) -> None:
        self.max_num_seqs = max_num_seqs
        self._running, self._live, self._forking = running, live, forking

    def pending_of(self, req: Request) -> int:
        """Seats `req` holds for samples still to fork it (only a leader holds any)."""
        state = self._live[req.request_id]
        return len(state.group.pending) if state.index == 0 else 0

    def needed(self, req: Request) -> int:
        return 1 + self.pending_of(req)

    def free(self) -> int:
        # Seats held for the pending samples of leaders that run (they fork into them).
        reserved = sum(len(g.pending) for g in self._forking if g.leader.status is RequestStatus.RUNNING)
        return self.max_num_seqs - len(self._running) - reserved

    def available_for(self, req: Request) -> bool:
        return self.needed(req) <= self.free()

    def taken(self) -> int:
        return len(self._running) + sum(self.pending_of(r) for r in self._running)
