"""Beam search: the beams of one request, expanded and pruned every step, on shared blocks.

The beams are the samples of the request's group (sample_group.py): Requests f"{id}#{i}", one
per slot i < width, that share KV blocks by reference count. Slot 0 prefills the prompt; the
others wait as `pending` until the first expansion forks them. Every step each live beam
computes its last token and the runner returns its 2 x width most likely next tokens with their
raw log probabilities (RunnerOutput.beam_candidates). Once every live beam has reported (a
barrier: a beam that ran ahead, or came back from a swap, waits `parked`), `BeamSearch.expand`
ranks the candidates by cumulative log probability, as transformers 5's `_beam_search` does:

    top 2W candidates of all beams ──┬─ the best W that do not stop: the next step's beams
                                     └─ those among the best W that stop (EOS, a stop id,
                                        max_tokens, the context): finished hypotheses scored
                                        sum_logprobs / generated_tokens ** length_penalty,
                                        the best W kept
    done: every top candidate stops, or early_stopping says no running beam can beat them.

How the scheduler moves the blocks (`plan_slots`): a parent's first continuation keeps the
parent's own slot and appends the token; every further continuation of it takes the slot of a
pruned beam (whose blocks are released first) and forks the parent's table: the full blocks
stay shared, and the partial last block is copied on its first write (block_manager.py), so a
fork costs one block at most. Slots nobody continues are pruned: their blocks go back at once.

    step k     slot0 [P P P][a b]    slot1 [P P P][a c]      (P: shared prompt blocks)
    expand     best: slot0+d, slot0+e  ->  slot0 appends d; slot1 is pruned, freed, then
               forks slot0's table and appends e: [P P P][a b] shared, copied on write.

Pure Python, no torch: the scheduler's part of the work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NextBeam:
    parent: int
    """The slot of the beam this one extends."""
    token: int
    score: float
    """Cumulative log probability of the generated tokens, this one included."""


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: what the client may get back."""

    token_ids: tuple[int, ...]
    score: float
    """sum_logprobs / len(token_ids) ** length_penalty (transformers' rule)."""
    cumulative_logprob: float
    finish_reason: str


@dataclass(frozen=True)
class Expansion:
    beams: list[NextBeam]
    """The next step's beams, best first (empty when done)."""
    done: bool


StopRule = Callable[[int, int], "str | None"]
"""(slot, token) -> the finish reason appending `token` to that beam would reach, or None."""


@dataclass(eq=False)
class BeamSearch:
    """One request's beam state between steps (the tokens live in its Requests)."""

    width: int
    length_penalty: float
    early_stopping: bool | str
    max_tokens: int
    scores: dict[int, float] = field(default_factory=lambda: {0: 0.0})
    """Live slot -> its cumulative log probability."""
    candidates: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Slots that reported this round -> their (token, logprob) candidates, best first."""
    hypotheses: list[Hypothesis] = field(default_factory=list)
    """The best `width` finished beams, best first."""
    improvable: bool = True
    """transformers' is_early_stop_heuristic_unsatisfied: once False, it stays False."""
    num_tokens: int = 0
    """Tokens every beam generated: one per kept beam and per finished hypothesis, each step (usage)."""

    def parked(self, slot: int) -> bool:
        return slot in self.candidates

    def ready(self) -> bool:
        """Every live beam has reported its candidates."""
        return all(slot in self.candidates for slot in self.scores)

    def expand(self, outputs: dict[int, list[int]], stops: StopRule) -> Expansion:
        """One step of beam search over the reported candidates; `outputs` holds every live slot's tokens."""
        w = self.width
        ranked = sorted(
            ((self.scores[slot] + lp, slot, rank, token)
             for slot, cands in self.candidates.items() for rank, (token, lp) in enumerate(cands)),
            key=lambda c: (-c[0], c[1], c[2]),
        )[: 2 * w]
        num_generated = len(next(iter(outputs.values()))) + 1  # beams move in lockstep
        accept = self.improvable and not (self._full and self.early_stopping is True)
        beams: list[NextBeam] = []
        finished: list[Hypothesis] = []
        all_stop = True
        for i, (score, slot, _, token) in enumerate(ranked):
            reason = stops(slot, token)
            if reason is None:
                all_stop = False
                if len(beams) < w:
                    beams.append(NextBeam(slot, token, score))
            elif i < w and accept:  # only the top W may finish; the rest are spares
                tokens = (*outputs[slot], token)
                finished.append(Hypothesis(tokens, score / num_generated**self.length_penalty, score, reason))
        self.hypotheses = sorted(self.hypotheses + finished, key=lambda h: -h.score)[:w]
        self.candidates = {}
        self.scores = {}
        if beams:
            self._check_improvable(beams[0].score, num_generated)
        done = all_stop or not beams or not self.improvable or (self._full and self.early_stopping is True)
        self.num_tokens += len(finished) + (0 if done else len(beams))
        return Expansion([] if done else beams, done)

    @property
    def _full(self) -> bool:
        return len(self.hypotheses) >= self.width

    def _check_improvable(self, best_running: float, num_generated: int) -> None:
        """Could the best running beam still beat the worst finished one? (transformers' heuristic)"""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_tokens  # a positive penalty favours the longest it may grow
        else:
            best_length = num_generated
        worst = self.hypotheses[-1].score if self._full else -1.0e9
        self.improvable = self.improvable and best_running / best_length**self.length_penalty > worst

    def results(self, n: int, outputs: dict[int, list[int]]) -> list[Hypothesis]:
        """The n best finished beams; running ones (scored as if finished) only when fewer finished."""
        best = list(self.hypotheses)
        if len(best) < n:
            for slot, score in sorted(self.scores.items(), key=lambda s: -s[1]):
                tokens = tuple(outputs[slot])
                best.append(Hypothesis(tokens, score / max(len(tokens), 1) ** self.length_penalty, score, "length"))
        return best[:n]


def plan_slots(beams: list[NextBeam], slots: list[int]) -> tuple[list[tuple[int, NextBeam]], list[int]]:
    """(slot, next beam) for each next beam, and the slots left over (pruned). `slots`: every
    live slot of the group (running or pending). A parent keeps its slot for its best
    continuation; later continuations take slots nobody continues."""
    placed: list[tuple[int, NextBeam]] = []
    kept = []
    for beam in beams:
        if beam.parent not in kept:
            kept.append(beam.parent)
            placed.append((beam.parent, beam))
    spare = [s for s in slots if s not in kept]
    for beam in beams:
        if all(b is not beam for _, b in placed):
            placed.append((spare.pop(0), beam))
    return placed, spare
