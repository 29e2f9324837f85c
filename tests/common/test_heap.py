"""common/heap.py: what start-up left alive is out of the collector's walk; what comes after is not."""

from __future__ import annotations

import gc
import weakref

from quiver.common.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector can free it


def test_freezing_keeps_live_objects_and_collects_start_up_garbage():
    kept = [Node() for _ in range(100)]
    start_up_garbage = Node()
    gone_before = weakref.ref(start_up_garbage)
    del start_up_garbage
    try:
        freeze_startup_heap()
        assert gone_before() is None  # collected before the freeze, not frozen with the rest
        assert gc.get_freeze_count() >= len(kept)
        later = Node()
        gone_after = weakref.ref(later)
        del later
        gc.collect()
        assert gone_after() is None  # garbage made after the freeze is still collected
    finally:
        gc.unfreeze()
