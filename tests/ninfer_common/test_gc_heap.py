"""ninfer_common.gc_heap: the start-up heap freeze and the collector's pause timing."""
from __future__ import annotations

import gc
import weakref

import pytest

from ninfer_common import gc_heap


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector reclaims it


@pytest.fixture
def unfrozen():
    assert gc.get_freeze_count() == 0, "the test process must not be frozen"
    yield
    gc.unfreeze()
    gc.collect()


def test_pauses_count_and_time_each_generation():
    p = gc_heap.GCPauses().install()
    try:
        _Node()
        gc.collect(2)
        gc.collect(0)
        counts, secs = p.snapshot()
        assert counts[2] >= 1 and counts[0] >= 1 and secs[2] > 0 and p.max_seconds >= secs[2] / counts[2]
    finally:
        p.uninstall()
    gc.collect(2)
    assert p.snapshot()[0] == counts  # uninstalled: no longer counting
    assert gc_heap.process_pauses() is gc_heap.process_pauses()  # one per process


def test_freeze_keeps_start_up_objects_out_of_collections(monkeypatch, unfrozen):
    monkeypatch.delenv(gc_heap.FREEZE_ENV, raising=False)
    old = _Node()
    ref = weakref.ref(old)
    n = gc_heap.freeze_heap("test")
    # n is the permanent generation right after the freeze; a thread left by an earlier test in this worker may
    # free frozen objects since (the count only shrinks: nothing else freezes)
    assert n > 1000 and 0 < gc.get_freeze_count() <= n
    del old
    gc.collect()
    assert ref() is not None  # frozen: a full collection skips it (why only process entry points freeze)
    young = _Node()
    young_ref = weakref.ref(young)
    del young
    gc.collect()
    assert young_ref() is None  # objects made after the freeze are collected as before
    gc.unfreeze()
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("value, on", [("0", False), (" 0 ", False), ("false", False), ("OFF", False), ("No", False),
                                      ("1", True), ("true", True), ("", True), (None, True)])
def test_the_environment_switch(monkeypatch, unfrozen, value, on):
    if value is None:
        monkeypatch.delenv(gc_heap.FREEZE_ENV, raising=False)
    else:
        monkeypatch.setenv(gc_heap.FREEZE_ENV, value)
    assert gc_heap.freeze_enabled() is on
    n = gc_heap.freeze_heap("test")
    assert (n > 0) is on and (0 < gc.get_freeze_count() <= n if on else gc.get_freeze_count() == 0)
