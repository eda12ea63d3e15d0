"""freeze_startup_objects: what lives at the call leaves the collector's walk; start-up's garbage goes first."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from shared.gc_pauses import freeze_startup_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Each test starts with nothing frozen and leaves nothing frozen; no automatic collection meanwhile."""
    gc.unfreeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_objects_alive_at_the_call_are_frozen_and_later_ones_are_not(unfrozen: None) -> None:
    before = [Node()]
    assert freeze_startup_objects() >= 2
    after = [Node()]
    walked = {id(o) for o in gc.get_objects()}  # the permanent generation is not walked
    assert id(before) not in walked and id(before[0]) not in walked
    assert id(after) in walked and id(after[0]) in walked


def test_start_up_garbage_is_collected_before_the_freeze(unfrozen: None) -> None:
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    freeze_startup_objects()
    assert gone() is None  # frozen, the cycle would never have been freed
