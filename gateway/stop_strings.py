"""Stop strings honoured across token boundaries, never included in the output.

Owns the text that is held back because it could still become a stop string.
A stop string may arrive split over any number of deltas ("Par" + "is"), so the
matcher releases text only once no suffix of it can start a stop string:

    pending = held + new_text
    stop found at i   -> emit pending[:i], finished
    otherwise         -> hold the longest suffix that is a prefix of some stop
                         string, emit the rest

Every occurrence of a stop string starts inside `pending` (anything emitted
earlier could not begin one), so a stop is never missed and the earliest
occurrence wins. With `include` (vLLM's include_stop_str_in_output) the matched
stop string is emitted too, and nothing after it. It knows nothing about tokens, HTTP or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    text: str
    """Text safe to send to the client now."""
    stopped: bool
    """A stop string matched: `text` ends just before it; send nothing more."""


class StopStringMatcher:
    def __init__(self, stop: Sequence[str], include: bool = False) -> None:
        assert all(stop), "stop strings are validated non-empty by the schema"
        self._stop = tuple(stop)
        self._include = include
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> StopResult:
        assert not self.stopped, "feed after a stop string matched"
        if not self._stop:
            return StopResult(text, False)
        pending = self._held + text
        # The earliest occurrence; at equal starts the longest string (what vLLM's include keeps).
        hit, length = min(((i, -len(s)) for s in self._stop if (i := pending.find(s)) >= 0), default=(-1, 0))
        if hit >= 0:
            self._held = ""
            self.stopped = True
            return StopResult(pending[: hit - length if self._include else hit], True)
        keep = self._longest_partial_suffix(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return StopResult(pending[: len(pending) - keep], False)

    def flush(self) -> str:
        """The generation ended without a stop: the held text was real output after all."""
        held, self._held = self._held, ""
        return held

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[-n:]):
                    best = n
                    break
        return best
