"""Preemption policy: which running request gives its blocks back, and how.

Pure decisions over request fields; the scheduler carries them out and the block
manager moves the blocks. Victims, in order: least urgent (largest level: the priority
a request was admitted at, aging included), then the cheapest to lose (fewest computed
tokens), then the latest arrival.

How a victim gives its blocks back ("auto" mode) is chosen by estimated time:

    swap       2 * blocks * swap_seconds_per_block        (copy out now, copy in later)
    recompute  computed tokens * recompute_seconds_per_token   (prefill them again)

A swap needs room in the CPU pool; without it the victim is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from engine.request import Request
from engine.scheduling.config import SchedulerConfig

PreemptKind = Literal["swap", "recompute"]


def victim_order(
    level_of: Callable[[Request], int], seq_of: Callable[[Request], int]
) -> Callable[[Request], tuple[int, ...]]:
    """Sort key: the first element in ascending order is the preferred victim."""

    def key(req: Request) -> tuple[int, ...]:
        return (-level_of(req), req.num_computed_tokens, -seq_of(req))

    return key


def pick_victim(
    candidates: Iterable[Request], level_of: Callable[[Request], int], seq_of: Callable[[Request], int]
) -> Request | None:
    return min(candidates, key=victim_order(level_of, seq_of), default=None)


def preempt_kind(
    config: SchedulerConfig, num_blocks: int, num_computed_tokens: int, cpu_free: int
) -> PreemptKind:
    if config.preemption_mode == "recompute" or num_blocks > cpu_free:
        return "recompute"
    if config.preemption_mode == "swap":
        return "swap"
    swap_cost = 2 * num_blocks * config.swap_seconds_per_block
    recompute_cost = num_computed_tokens * config.recompute_seconds_per_token
    return "swap" if swap_cost <= recompute_cost else "recompute"


def plan_room(
    candidates: list[Request],
    short_blocks: int,
    short_seats: int,
    room_freed_by: Callable[[Request], tuple[int, int]],
) -> list[Request]:
    """The first victims (in candidate order) whose preemption covers both shortfalls, or
    no victim at all when even all of them would not: a useless preemption only costs."""
    victims: list[Request] = []
    for victim in candidates:
        if short_blocks <= 0 and short_seats <= 0:
            break
        blocks, seats = room_freed_by(victim)
        victims.append(victim)
        short_blocks, short_seats = short_blocks - blocks, short_seats - seats
    return victims if short_blocks <= 0 and short_seats <= 0 else []
