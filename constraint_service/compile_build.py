"""How one cold compile runs: compile slots, the deadline, abandoned threads, killable worker processes.

The build half of :class:`~constraint_service.compiler.ConstraintCompiler` (which keeps the cache: keys,
hits, waiters, the byte budget, the failure memory), as the mixin :class:`BuildRunner`:

* At most ``max_cold_compiles`` builds hold a slot at once; waiting for a slot counts against the
  request's deadline (``CompileTimeout`` when none frees in time).
* With a compile pool (``isolate=True``, the sidecar) a build is first proven in a killable worker process
  (``compile_pool``), killed at the deadline, then the returned grammar is compiled in-process.
* Without one, the build runs on a daemon thread; on timeout the thread is *abandoned*: it gives its
  slot back, is re-niced to 19 and settles its result late.  While ``max_abandoned_compiles`` abandoned
  builds still run, sources larger than :data:`SMALL_SOURCE_BYTES` wait (within their deadline); small
  ones are admitted up to four times that.
* After the compile, the mask-cost probe (:mod:`~constraint_service.mask_probe`) walks the grammar and
  refuses it with ``GrammarTooExpensive`` when one token mask takes longer than ``mask_probe_limit_s``:
  in the worker process right after its proof compile (killed at the deadline with it), or on the build
  thread without a pool (the owner's deadline covers it: past it the build is abandoned as usual, and its
  late verdict, a grammar or ``GrammarTooExpensive``, is cached). A grammar a worker proved is not probed
  again in-process.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .backend import Backend, CompiledConstraint
from .compile_pool import WorkerCrashed
from .errors import ConstraintError
from .mask_probe import check_mask_cost, probe_seed
from .registry import kind_entry, user_input_error
from .tools.wrap import Wrapped, wrapped_grammar
from .types import ConstraintKind, ConstraintSpec

__all__ = ["BuildRunner", "SMALL_SOURCE_BYTES"]

#: Sources up to this size are admitted while the abandoned-compile pool is full.
SMALL_SOURCE_BYTES = 16 << 10


def _lower_priority(native_id: int) -> None:
    """Best effort: give an abandoned compile thread the lowest CPU priority (nice 19).

    Linux schedules threads individually and lets any thread raise its own
    niceness, so the abandoned compile only uses CPU the serving threads and
    live compiles leave idle.  xgrammar runs a ``max_threads=1`` compile on
    the calling thread (no pool thread), so this covers all of its work.
    """
    if not native_id or not hasattr(os, "setpriority"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, native_id, 19)
    except OSError:
        pass


@dataclass
class Build:
    key: tuple
    finished: threading.Event = field(default_factory=threading.Event)  # worker done
    settled: threading.Event = field(default_factory=threading.Event)  # outcome published
    result: Optional[CompiledConstraint] = None
    error: Optional[BaseException] = None
    abandoned: bool = False  # the owner gave up (deadline); the worker settles late
    started: bool = False  # a worker thread runs / ran it
    native_id: int = 0  # the worker's OS thread id (for re-nicing when abandoned)
    size: int = 0  # source bytes (admission while the abandoned pool is full)
    spec: Optional[ConstraintSpec] = None  # what to compile (sent to a compile worker process)


class BuildRunner:
    """Runs owned builds for :class:`~constraint_service.compiler.ConstraintCompiler` (a mixin).

    Uses the compiler's ``backend``, ``compile_timeout_s``, ``max_cold_compiles``,
    ``max_abandoned_compiles``, ``compile_threads`` (isolated builds), ``mask_probe_limit_s`` /
    ``mask_probe_steps`` (the mask-cost probe), ``stats``, ``_pool`` (a ``CompilePool`` or None), ``_lock`` (stats),
    ``_slot_cv`` / ``_running`` / ``_abandoned`` (slot accounting) and ``_settle`` (publishes a build
    that finished after its owner gave up).
    """

    def _may_start_locked(self, size: int) -> bool:
        if self._running >= self.max_cold_compiles:
            return False
        if size > SMALL_SOURCE_BYTES:
            return self._abandoned < self.max_abandoned_compiles
        return self._abandoned < 4 * max(1, self.max_abandoned_compiles)

    def _acquire_slot(self, size: int = 0, deadline: Optional[float] = None) -> None:
        """Take a compile slot, waiting at most until ``deadline`` (CompileTimeout after)."""
        with self._slot_cv:
            while not self._may_start_locked(size):
                if deadline is None:
                    self._slot_cv.wait()
                    continue
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise ConstraintError(
                        "CompileTimeout",
                        "no compile slot became free before the compile deadline "
                        f"({self.compile_timeout_s:g} s); the server is busy compiling, retry later",
                        "",
                    )
                self._slot_cv.wait(left)
            self._running += 1

    def _run_owned_build(self, build: Build, kind: ConstraintKind, canon: Any,
                         deadline: Optional[float] = None) -> None:
        if deadline is None:
            deadline = time.perf_counter() + self.compile_timeout_s
        backend = self.backend  # lazy vocabulary index, charged to this prepare
        self._acquire_slot(build.size, deadline)
        if self._pool is not None:
            self._run_isolated(build, backend, kind, deadline)
            return
        worker = threading.Thread(
            target=self._worker, args=(build, backend, kind, canon),
            name=f"ninfer-compile-{kind}", daemon=True,
        )
        try:
            with self._slot_cv:
                build.started = True
            worker.start()
        except BaseException:
            with self._slot_cv:
                build.started = False
                self._running -= 1
                self._slot_cv.notify_all()
            raise
        build.finished.wait(max(0.0, deadline - time.perf_counter()))
        with self._slot_cv:
            if not build.finished.is_set():
                # abandoned: the slot goes back now, the thread keeps running at low priority
                build.abandoned = True
                self._running -= 1
                self._abandoned += 1
                self._slot_cv.notify_all()
                _lower_priority(build.native_id)

    def _run_isolated(self, build: Build, backend: Backend, kind: ConstraintKind, deadline: float) -> None:
        """Prove the compile in a worker process (killed at ``deadline``), then compile its grammar here;
        runs on the owner's thread with a slot held, never abandoned."""
        result = error = None
        try:
            build.started = True
            text, _ = self._pool.prove(build.spec, deadline)
            # proven to end in time, so it may use the compile threads (nothing is left to re-nice)
            result = self.compile_grammar(backend, kind, backend.grammar_from_text(text), build.key,
                                          threads=self.compile_threads)
        except ConstraintError as exc:
            error = exc
            if exc.kind == "CompileTimeout":
                with self._lock:
                    self.stats.killed = self._pool.kills
        except WorkerCrashed as exc:  # e.g. out of memory on a huge constraint: not remembered
            error = ConstraintError(kind_entry(kind).error_kind if kind is not None else "UnsupportedSchema",
                                    f"the grammar compiler failed on this constraint ({exc})", "")
            error.transient = True  # may depend on load (memory): never remembered
        except Exception as exc:  # noqa: BLE001 - user input we failed to convert
            error = user_input_error(kind, exc)
        with self._slot_cv:
            self._running -= 1
            build.result, build.error = result, error
            build.finished.set()
            self._slot_cv.notify_all()

    def _worker(self, build: Build, backend: Backend, kind: ConstraintKind, canon: Any) -> None:
        build.native_id = threading.get_native_id()
        with self._slot_cv:
            if build.abandoned:  # given up before this thread ran: re-nice ourselves
                _lower_priority(build.native_id)
        result = error = None
        try:
            compiled = self._build_grammar(backend, kind, canon, build.key)
            self.probe_mask_cost(compiled)
            result = compiled  # only a grammar that passed the probe is cached
        except ConstraintError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - user input we failed to convert
            error = user_input_error(kind, exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the owner
            error = exc
        with self._slot_cv:
            if build.abandoned:
                self._abandoned -= 1
            else:
                self._running -= 1
            build.result, build.error = result, error
            build.finished.set()
            late = build.abandoned
            self._slot_cv.notify_all()
        if late:
            self._settle(build)

    def _build_grammar(self, backend: Backend, kind: ConstraintKind | None, canon: Any, key: tuple) -> CompiledConstraint:
        """Convert and compile; runs on a worker thread (which then probes the mask cost)."""
        return self.compile_grammar(backend, kind, self.grammar_of(backend, kind, canon), key)

    def probe_mask_cost(self, compiled: CompiledConstraint) -> None:
        """The mask-cost probe (:func:`~constraint_service.mask_probe.check_mask_cost`) with this compiler's
        limit; nothing when it is off (``mask_probe_limit_s`` 0). At most ``mask_probe_steps + 1`` fills, each
        at most about the limit (the walk stops at the first one over it).

        Raises:
            ConstraintError: ``GrammarTooExpensive``.
        """
        if self.mask_probe_limit_s > 0:
            check_mask_cost(compiled, probe_seed(compiled.key), self.mask_probe_limit_s, steps=self.mask_probe_steps)

    @staticmethod
    def grammar_of(backend: Backend, kind: ConstraintKind | None, canon: Any) -> Any:
        """The backend grammar of a canonical source (the kind's registry entry, or the tool/thinking
        builder for a wrapped constraint).

        Raises:
            ConstraintError: the kind's error kind; other exceptions for input the converter failed on.
        """
        if isinstance(canon, Wrapped):
            return wrapped_grammar(backend, kind, canon)
        return kind_entry(kind).to_grammar(backend, canon)

    @staticmethod
    def compile_grammar(backend: Backend, kind: ConstraintKind | None, grammar: Any, key: tuple,
                        threads: int = 1) -> CompiledConstraint:
        """Compile a backend grammar (eagerly: every token mask is built now) on ``threads`` threads.

        Raises:
            ConstraintError: the kind's error kind when the backend rejects it.
        """
        error_kind = kind_entry(kind).error_kind if kind is not None else "UnsupportedSchema"
        return backend.compile(grammar, kind=kind_entry(kind).kind if kind is not None else None, key=key,
                               error_kind=error_kind, threads=threads)
