"""Python garbage-collector pauses in the serving processes: freeze the start-up heap, time every collection.

A full (generation 2) collection walks every object the collector tracks. After start-up the engine and the
sidecar each track about 200,000 (torch, grpc, protobuf and xgrammar modules, the model's Python objects),
and a full collection of them stops every thread of the process for 80-100 ms on the H200 host (measured in
the engine's closed loop, 2026-12-02: one such pause every ~1 s of constrained B = 64 decoding; see README
"GC pauses"). Requests allocate steadily, so CPython starts a full collection whenever the objects that
survived the young generations reach a quarter of the old one.

:func:`freeze_heap` is what vLLM does after start-up (``vllm/utils/gc_utils.py``, ``freeze_gc_heap``):
collect once, then move every live object into the permanent generation (:func:`gc.freeze`), which later
collections skip. Objects created afterwards are collected as before; only cyclic garbage made of
objects alive at the freeze is never reclaimed, so it is called once per process, when start-up is done,
from the process's entry point (never from library code that tests run in-process).

``NINFER_GC_FREEZE=0`` (or ``false`` / ``off`` / ``no``) turns the freeze off (A/B runs; ``bench/engine_bench.py --gc-freeze off``).
"""
from __future__ import annotations

import gc
import logging
import os
import time

log = logging.getLogger("ninfer.gc")

#: Environment switch read by :func:`freeze_enabled` (``0`` / ``false`` / ``off`` / ``no``, any case = off;
#: anything else or unset = on).
FREEZE_ENV = "NINFER_GC_FREEZE"
_OFF = frozenset({"0", "false", "off", "no"})


def freeze_enabled() -> bool:
    """Whether this process should freeze its start-up heap (``NINFER_GC_FREEZE``, default on)."""
    return os.environ.get(FREEZE_ENV, "1").strip().lower() not in _OFF


def freeze_heap(context: str) -> int:
    """Collect every generation, then freeze what is alive (:func:`gc.freeze`), when :func:`freeze_enabled`.

    Args:
        context: which process / moment, for the log line.

    Returns:
        The number of objects in the permanent generation afterwards (:func:`gc.get_freeze_count`), or 0
        when the freeze is turned off.
    """
    if not freeze_enabled():
        return 0
    t0 = time.perf_counter()
    gc.collect()  # garbage first: frozen garbage would never be reclaimed
    gc.freeze()
    n = gc.get_freeze_count()
    log.info("%s: froze %d objects of the start-up heap in %.0f ms", context, n, 1e3 * (time.perf_counter() - t0))
    return n


class GCPauses:
    """Count and duration of the collector's runs per generation, from :data:`gc.callbacks`.

    The collector calls back on the thread that runs the collection, with the GIL held, and never runs two
    collections at once, so plain fields suffice.

    Attributes:
        collections: ``[3]`` runs per generation (0, 1, 2) since :meth:`install`.
        seconds: ``[3]`` wall seconds spent in them (``time.perf_counter``; every thread of the process is
            stopped meanwhile).
        max_seconds: the longest single run.
    """

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.max_seconds = 0.0
        self._t0: float | None = None
        self._installed = False

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        t0, self._t0 = self._t0, None
        if t0 is None:  # installed mid-collection
            return
        dt = time.perf_counter() - t0
        g = min(int(info.get("generation", 2)), 2)
        self.collections[g] += 1
        self.seconds[g] += dt
        if dt > self.max_seconds:
            self.max_seconds = dt

    def install(self) -> "GCPauses":
        """Start timing collections (idempotent); returns self."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def uninstall(self) -> None:
        """Stop timing collections (the figures stay)."""
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def snapshot(self) -> tuple[tuple[int, int, int], tuple[float, float, float]]:
        """``(collections, seconds)`` per generation so far (copies)."""
        return tuple(self.collections), tuple(self.seconds)


_PROCESS_PAUSES = GCPauses()


def process_pauses() -> GCPauses:
    """The process-wide :class:`GCPauses`, timing from the first call on (what the engine's metrics export)."""
    return _PROCESS_PAUSES.install()
