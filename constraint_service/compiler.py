"""Compile cache: one immutable compiled grammar per key, shared by all requests.

How one cold build runs (slots, deadline, abandoned threads, killable worker processes) is the mixin
``compile_build.BuildRunner``; this module keeps the cache (keys, hits, waiters, budget, failures).

Seed 000 §编译与缓存, issue 3 "Compilation and cache":

* key = (kind, canonical source, compile options, output wrapper id,
  vocabulary id).  JSON sources keep property order (parsed with
  ``object_pairs_hook``, numbers kept as written, re-serialised compactly --
  never sorted).  Choice keys use the de-duplicated, sorted literal set.
* Byte budget (default 256 MiB) over ``CompiledGrammar.memory_size_bytes``;
  least-recently-used entries that no session holds are evicted; an evicted
  grammar in use stays alive (sessions hold references).
* At most ``max_cold_compiles`` builds run at once; each runs on its own
  daemon worker thread (xgrammar releases the GIL while compiling, measured:
  a 23 s compile stalls other Python threads by < 20 ms).  A second request
  for a key being built waits for that build (``"waited"``); hits take no
  slot (``"hit"``).  Waiting for a slot counts against the deadline: a
  request never queues unboundedly behind other builds.
* Compile deadline (default 10 s).  With ``isolate=True`` (the sidecar) a cold
  compile first runs in a killable worker process (``compile_pool``): on
  timeout that process is killed and replaced, nothing keeps running; the
  sidecar then compiles the worker's grammar in-process (a build just shown
  to end in time).  Without it (library use, unit tests) the build runs on a
  thread: xgrammar cannot cancel a compile, so on timeout the request fails
  with ``CompileTimeout`` and the worker thread is *abandoned*: it always gives its slot back (moves to the abandoned pool)
  and is re-niced to the lowest CPU priority so the serving threads and new
  compiles keep their CPU share.  While ``max_abandoned_compiles`` abandoned
  builds still run, new builds of *large* sources (more than
  :data:`SMALL_SOURCE_BYTES`) wait (within their deadline) for the pool to
  drain; small sources are admitted up to a hard cap of four times that.
  That bounds compile threads without letting big timed-out requests starve
  small ones (before: a full pool kept slots held and a tiny ``choice``
  waited ~140 s for an abandoned compile to end).  An abandoned build stays
  registered under its key: the same request again waits for it (within its
  own deadline) instead of starting a duplicate compile, and its late result
  is cached (a late deterministic failure is remembered).
* Mask-cost probe (``mask_probe_limit_s``, default 250 ms; :mod:`mask_probe`):
  after the compile (in the worker process with ``isolate``, on the build
  thread without), a deterministic walk of up to ``mask_probe_steps`` tokens
  times each token-mask fill; one slower than the limit refuses the
  constraint with ``GrammarTooExpensive`` (a grammar that compiles but would
  stall every Step, e.g. ``([a-z]+ " "?){0,200}``: 0.4-1.5 s per mask).  Its
  time counts against the compile deadline.
* Only deterministic build failures (syntax, unsupported, unsatisfiable,
  nesting too deep, ``GrammarTooExpensive`` ...) are remembered per key
  (bounded LRU) so a repeated pathological request fails fast;
  ``CompileTimeout`` is never remembered -- it depends on load.
* Everything kind-specific (canonical forms, size caps, converters, error
  kinds, compile options) is the kind's entry in ``registry.py``; the grammar
  library is reached only through ``backend`` (xgrammar today).  Unexpected
  exceptions while validating or converting user input (e.g.
  ``RecursionError`` for a regex nested 300 deep) become a ``ConstraintError``
  of the kind's error kind ("nesting too deep (...)"), never a server fault.
* The vocabulary index (the backend) is built lazily on the first cold
  compile, once, under a lock; unconstrained workloads never pay for it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .backend import Backend, CompiledConstraint, XGrammarBackend
from .compile_build import SMALL_SOURCE_BYTES, Build, BuildRunner
from .compile_pool import CompilePool
from .errors import ConstraintError
from .mask_probe import DEFAULT_MASK_PROBE_LIMIT_S, DEFAULT_MASK_PROBE_STEPS
from .registry import kind_entry
from .tools.wrap import Wrapped
from .types import CacheStatus, CompileInfo, ConstraintKind, ConstraintSpec
from .vocab import Vocabulary

__all__ = ["CompileStats", "ConstraintCompiler", "SMALL_SOURCE_BYTES"]

#: The model output wrapper of a plain body; thinking/tool wrappers are the canonical JSON of the
#: request's output plan (``ConstraintSpec.wrapper``).
PLAIN_WRAPPER = "plain"

#: Bounds of the canonical-form memo (:class:`_CanonicalMemo`): bytes of the strings and tuples it holds (each
#: request's fields and its canonical form, ``sys.getsizeof``), entries kept.
CANONICAL_MEMO_BYTES = 64 << 20
CANONICAL_MEMO_ENTRIES = 4096


def _held_bytes(*parts: Any) -> int:
    """``sys.getsizeof`` of ``parts`` and, for tuples, of their items (strings and tuples of strings)."""
    n = 0
    for p in parts:
        n += sys.getsizeof(p)
        if isinstance(p, tuple):
            n += sum(map(sys.getsizeof, p))
    return n


class _CanonicalMemo:
    """Cache key, converter value and size of a request's constraint, by the request's own fields.

    Canonicalising is a pure function of ``(kind, source, choices, wrapper)``: a JSON Schema is parsed and
    re-serialised on every Prepare (0.07-1.6 ms of GIL-holding Python per JSONSchemaBench schema on the
    dev box, ~80% of a cache-hit Prepare), which the sidecar's Step thread then waits for. The memo is
    keyed by those field values (never by object identity), keeps only successful results (a malformed
    source is checked again each time) and drops the least recently used entries past
    :data:`CANONICAL_MEMO_BYTES` (the bytes of an entry's fields and canonical form, object headers and tuple
    slots included) or :data:`CANONICAL_MEMO_ENTRIES` entries.
    """

    def __init__(self, max_bytes: int = CANONICAL_MEMO_BYTES, max_entries: int = CANONICAL_MEMO_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max(0, int(max_bytes)), max(0, int(max_entries))
        self._lock = threading.Lock()
        self._entries: "OrderedDict[tuple, tuple[tuple, int]]" = OrderedDict()  # fields -> (value, bytes)
        self._bytes = 0

    def get(self, fields: tuple) -> Optional[tuple]:
        with self._lock:
            hit = self._entries.get(fields)
            if hit is None:
                return None
            self._entries.move_to_end(fields)
            return hit[0]

    def put(self, fields: tuple, value: tuple, extra_bytes: int = 0) -> None:
        """Remember ``value`` for ``fields`` (``(kind, source, choices, wrapper)``); ``extra_bytes``: what
        ``value`` holds beyond the fields (its canonical text and values)."""
        cost = _held_bytes(*fields[1:]) + int(extra_bytes)
        if cost > self.max_bytes or self.max_entries == 0:
            return
        with self._lock:
            if fields in self._entries:
                return
            self._entries[fields] = (value, cost)
            self._bytes += cost
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, c) = self._entries.popitem(last=False)
                self._bytes -= c

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class CompileStats:
    """Counters since start (monotonic; labels are fixed enums, never content)."""

    hits: int = 0
    built: int = 0
    waited: int = 0
    failures: int = 0
    timeouts: int = 0
    evictions: int = 0
    killed: int = 0  # compile worker processes killed at the deadline (``isolate=True``)


class ConstraintCompiler(BuildRunner):
    """Compile cache for one vocabulary (thread-safe).

    Args:
        vocab: the model vocabulary (``Vocabulary`` or any object with its fields).
        cache_bytes: budget for retained compiled grammars, bytes (default 256 MiB).
        max_cold_compiles: builds running at once (hits and waiters take none).
        compile_timeout_s: per-build deadline, seconds (parse + convert + compile).
        max_abandoned_compiles: timed-out builds whose threads may keep running
            (at nice 19, never holding a slot) before new builds of sources larger
            than :data:`SMALL_SOURCE_BYTES` wait for them (default: ``max_cold_compiles``;
            small sources are admitted up to four times as many).
        fill_threads: the most threads of the backend's batch mask fill.
        fill_rows_per_thread: rows per batch-fill thread (``XGrammarBackend``'s); None or negative = the backend's default
            (not passed to ``backend_factory``).
        max_failures_remembered: size of the per-key failure memory.
        backend_factory: builds the :class:`~constraint_service.backend.base.Backend`
            as ``backend_factory(vocab, fill_threads=..., [fill_rows_per_thread=...])`` on first constrained use
            (default :class:`~constraint_service.backend.XGrammarBackend`).
        isolate: run each cold compile first in a killable worker process (a warm pool of
            ``max_cold_compiles`` processes, started now in the background; xgrammar backend only),
            killed and replaced on ``CompileTimeout``; call :meth:`close` when done.
        compile_threads: xgrammar threads per cold compile, with ``isolate`` only (the worker's proof
            and the in-process compile after it); without ``isolate`` a build stays on its one thread,
            which is re-niced if the build is abandoned at its deadline.
        mask_probe_limit_s: the longest one token-mask fill of the compile-time probe walk may take (thread
            CPU seconds; :mod:`~constraint_service.mask_probe`) before the constraint is refused with
            ``GrammarTooExpensive``; 0 = no probe.
        mask_probe_steps: tokens the probe walk accepts (at most ``mask_probe_steps + 1`` fills).
    """

    def __init__(self, vocab: Vocabulary, *, cache_bytes: int = 256 << 20,
                 max_cold_compiles: int = 2, compile_timeout_s: float = 10.0,
                 max_abandoned_compiles: Optional[int] = None, fill_threads: int = 2,
                 fill_rows_per_thread: Optional[int] = None, max_failures_remembered: int = 256,
                 backend_factory: Callable[..., Backend] = XGrammarBackend, isolate: bool = False,
                 compile_threads: int = 1, mask_probe_limit_s: float = DEFAULT_MASK_PROBE_LIMIT_S,
                 mask_probe_steps: int = DEFAULT_MASK_PROBE_STEPS) -> None:
        if max_cold_compiles < 1:
            raise ValueError("max_cold_compiles must be >= 1")
        self.vocab = Vocabulary.from_any(vocab)
        self.cache_bytes = int(cache_bytes)
        self.max_cold_compiles = int(max_cold_compiles)
        self.max_abandoned_compiles = (
            self.max_cold_compiles if max_abandoned_compiles is None else int(max_abandoned_compiles)
        )
        self.compile_timeout_s = float(compile_timeout_s)
        self.mask_probe_limit_s = max(0.0, float(mask_probe_limit_s))
        self.mask_probe_steps = max(0, int(mask_probe_steps))
        self.stats = CompileStats()
        self._fill_kw: dict = {"fill_threads": fill_threads}
        if fill_rows_per_thread is not None and fill_rows_per_thread >= 0:  # negative: the backend's default
            self._fill_kw["fill_rows_per_thread"] = int(fill_rows_per_thread)
        self._backend_factory = backend_factory
        self._max_failures = max_failures_remembered
        self._backend: Optional[Backend] = None
        self._backend_lock = threading.Lock()
        self._lock = threading.Lock()  # cache, in-flight, failures, stats
        self._slot_cv = threading.Condition()  # slot accounting
        self._running = 0
        self._abandoned = 0
        self._entries: "OrderedDict[tuple, CompiledConstraint]" = OrderedDict()
        self._bytes = 0
        self._inflight: dict[tuple, Build] = {}
        self._failures: "OrderedDict[tuple, ConstraintError]" = OrderedDict()
        self._evict_pending = False
        self._canonical = _CanonicalMemo()
        # threads only where a build is proven in a killable process first (an abandoned in-thread build
        # must stay on its one re-niced thread)
        self.compile_threads = max(1, int(compile_threads)) if isolate else 1
        self._pool: Optional[CompilePool] = (
            CompilePool(self.vocab, self.max_cold_compiles, self.compile_threads,
                        mask_probe_limit_s=self.mask_probe_limit_s, mask_probe_steps=self.mask_probe_steps)
            if isolate else None)

    # -- public ---------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The grammar backend (xgrammar); builds the vocabulary index on first use."""
        b = self._backend
        if b is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = self._backend_factory(self.vocab, **self._fill_kw)
                b = self._backend
        return b

    @property
    def index_built(self) -> bool:
        """Whether the vocabulary index exists yet."""
        return self._backend is not None

    @property
    def cached_bytes(self) -> int:
        """Bytes of compiled grammars currently retained."""
        return self._bytes

    @property
    def num_cached(self) -> int:
        return len(self._entries)

    @property
    def compiles_running(self) -> tuple[int, int]:
        """(builds holding a slot, abandoned builds still running)."""
        with self._slot_cv:
            return self._running, self._abandoned

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the compile worker processes (``[]`` without ``isolate``)."""
        return self._pool.pids if self._pool is not None else []

    def wait_workers(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a warm compile worker (True at once without ``isolate``)."""
        return self._pool.wait_ready(timeout) if self._pool is not None else True

    def close(self) -> None:
        """Kill the compile worker processes (idempotent); cached grammars stay usable."""
        if self._pool is not None:
            self._pool.close()

    def cache_key(self, spec: ConstraintSpec) -> tuple:
        """The cache key of ``spec`` (validates choice lists and schema JSON).

        Raises:
            ConstraintError: ``InvalidChoice`` / ``InvalidSchema`` (not JSON).
            ValueError: unknown kind or fields that do not belong to the kind.
        """
        return self._key_and_source(spec)[0]

    def compile(self, spec: ConstraintSpec) -> tuple[CompiledConstraint, CompileInfo]:
        """Return the compiled grammar for ``spec`` and how it was obtained.

        Thread-safe; blocks the caller until the grammar is ready (the compile
        itself runs on a worker thread).

        Raises:
            ConstraintError: any request error of the kind (``InvalidGrammar``,
                ``InvalidTokenReference``, ``InvalidRegex``, ``InvalidChoice``,
                ``InvalidSchema``/``UnsupportedSchema``/``UnsatisfiableSchema``,
                ``CompileTimeout``, ``GrammarTooExpensive``).
            ValueError: malformed ``spec`` (unknown kind).
        """
        t0 = time.perf_counter()
        deadline = t0 + self.compile_timeout_s
        key, canon, size = self._key_and_source(spec)
        with self._lock:
            if self._evict_pending:
                self._evict_pending = False
                self._evict_locked()
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return entry, CompileInfo(CacheStatus.HIT, time.perf_counter() - t0)
            failure = self._failures.get(key)
            if failure is not None:
                self._failures.move_to_end(key)
                raise ConstraintError(failure.kind, failure.message, failure.location)
            build = self._inflight.get(key)
            owner = build is None
            if owner:
                build = Build(key, size=size, spec=spec)
                self._inflight[key] = build
        if not owner:
            # the same key is being built (possibly by an abandoned worker): wait for it,
            # within this request's own deadline, instead of compiling it twice
            if not build.finished.wait(max(0.0, deadline - time.perf_counter())):
                raise self._timeout_error(spec.kind)
            with self._lock:
                self.stats.waited += 1
            if build.error is not None:
                err = build.error
                if isinstance(err, ConstraintError):
                    raise ConstraintError(err.kind, err.message, err.location)
                raise err
            return build.result, CompileInfo(CacheStatus.WAITED, time.perf_counter() - t0)
        try:
            self._run_owned_build(build, spec.kind, canon, deadline)
        except BaseException as exc:  # noqa: BLE001 - e.g. the vocabulary index failed, no slot in time
            with self._slot_cv:
                if not build.started:
                    build.result, build.error = None, exc
                    build.finished.set()
        with self._slot_cv:
            abandoned = build.abandoned
        if abandoned:
            with self._lock:
                self.stats.failures += 1
                self.stats.timeouts += 1
            raise self._timeout_error(spec.kind)
        self._settle(build)
        if build.error is not None:
            if isinstance(build.error, ConstraintError) and build.error.kind == "CompileTimeout":
                with self._lock:
                    self.stats.timeouts += 1
                raise self._timeout_error(spec.kind)
            raise build.error
        return build.result, CompileInfo(CacheStatus.BUILT, time.perf_counter() - t0)

    def clear(self) -> None:
        """Drop every retained grammar and remembered failure (held ones stay alive)."""
        with self._lock:
            for e in self._entries.values():
                e._on_idle = None
            self._entries.clear()
            self._failures.clear()
            self._bytes = 0

    # -- internals ------------------------------------------------------------
    def _key_and_source(self, spec: ConstraintSpec) -> tuple[tuple, Any, int]:
        """(cache key, value for the kind's converter, source bytes) -- the kind's registry entry;
        a wrapped constraint (thinking / tools) carries ``Wrapped(body value, body text, wrapper)``.
        Remembered by the spec's field values (:class:`_CanonicalMemo`)."""
        fields = (spec.kind, spec.source, tuple(spec.choices), spec.wrapper)
        try:
            hit = self._canonical.get(fields)
        except TypeError:  # an unhashable field (not from the wire): canonicalised without the memo
            return self._canonicalise(spec)
        if hit is not None:
            return hit
        out = self._canonicalise(spec)
        key, value, _ = out
        text = key[1]  # the canonical text; the converter value is often that same object
        self._canonical.put(fields, out, extra_bytes=_held_bytes(text) + (0 if value is text else _held_bytes(value)))
        return out

    def _canonicalise(self, spec: ConstraintSpec) -> tuple[tuple, Any, int]:
        if spec.kind is None:  # wrapper only (tools and/or thinking, no body)
            return ("", "", (), spec.wrapper, self.vocab.fingerprint()), Wrapped(None, "", spec.wrapper), 0
        entry = kind_entry(spec.kind)
        canon = entry.canonicalise(spec)
        wrapper = spec.wrapper or PLAIN_WRAPPER
        key = (entry.name, canon.text, entry.compile_options, wrapper, self.vocab.fingerprint())
        value = Wrapped(canon.value, canon.text, spec.wrapper) if spec.wrapper else canon.value
        size = canon.size + len(spec.wrapper.encode())
        return key, value, size

    def _timeout_error(self, kind: ConstraintKind) -> ConstraintError:
        return ConstraintError(
            "CompileTimeout",
            f"compiling the {kind if kind is not None else 'tool/thinking'} constraint took longer than "
            f"{self.compile_timeout_s:g} s",
            "",
        )

    def _settle(self, build: Build) -> None:
        """Publish a finished build: cache the result or remember a deterministic failure."""
        with self._lock:
            if self._inflight.get(build.key) is build:
                del self._inflight[build.key]
            if build.result is not None:
                if not build.abandoned:
                    self.stats.built += 1
                if build.key not in self._entries:
                    self._insert_locked(build.result)
            else:
                if not build.abandoned:
                    self.stats.failures += 1
                err = build.error
                # CompileTimeout depends on load: never remembered
                if (isinstance(err, ConstraintError) and err.kind != "CompileTimeout"
                        and not getattr(err, "transient", False)):
                    self._failures[build.key] = err
                    while len(self._failures) > self._max_failures:
                        self._failures.popitem(last=False)
        build.settled.set()

    def _insert_locked(self, entry: CompiledConstraint) -> None:
        self._entries[entry.key] = entry
        self._bytes += entry.memory_size_bytes
        entry._on_idle = self._on_entry_idle
        self._evict_locked()

    def _evict_locked(self) -> None:
        if self._bytes <= self.cache_bytes:
            return
        for key in list(self._entries):
            if self._bytes <= self.cache_bytes:
                break
            entry = self._entries[key]
            if entry.num_holders == 0:
                del self._entries[key]
                entry._on_idle = None
                self._bytes -= entry.memory_size_bytes
                self.stats.evictions += 1

    def _on_entry_idle(self, entry: CompiledConstraint) -> None:
        # May run from a GC finalizer on a thread that already holds the lock:
        # never block here; defer to the next compile() instead.
        if self._lock.acquire(blocking=False):
            try:
                self._evict_locked()
            finally:
                self._lock.release()
        else:
            self._evict_pending = True
