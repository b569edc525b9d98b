"""Compile cache: one immutable compiled grammar per key, shared by all requests.

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
* Compile deadline (default 10 s).  xgrammar cannot cancel a compile, so on
  timeout the request fails with ``CompileTimeout`` and the worker thread is
  *abandoned*: it always gives its slot back (moves to the abandoned pool)
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
* Only deterministic build failures (syntax, unsupported, unsatisfiable,
  nesting too deep ...) are remembered per key (bounded LRU) so a repeated
  pathological request fails fast; ``CompileTimeout`` is never remembered --
  it depends on load.
* Source size caps: :data:`MAX_SOURCE_BYTES` (1 MiB, the public server's cap)
  for grammar/regex/schema text and for the total bytes of a choice list,
  :data:`MAX_CHOICE_OPTION_BYTES` per choice option.
* Unexpected exceptions while validating or converting user input (e.g.
  ``RecursionError`` for a regex nested 300 deep) become a ``ConstraintError``
  of the constraint's kind ("nesting too deep (...)"), never a server fault.
* The vocabulary index (``TokenizerInfo``) is built lazily on the first cold
  compile, once, under a lock; unconstrained workloads never pay for it.

``json_object`` is a fixed grammar (:data:`JSON_OBJECT_EBNF`): any JSON
object text as JSON allows it (RFC 8259 values, escapes, numbers), root must
be an object with no whitespace before ``{`` or after the final ``}``, and
every whitespace run between tokens is at most :data:`JSON_OBJECT_MAX_WS`
characters so a model cannot loop forever on blanks.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from .backend import CompiledConstraint, XGrammarBackend
from .choice import choice_to_ebnf, normalize_choices
from .errors import ConstraintError
from .gbnf import parse_gbnf
from .types import CONSTRAINT_KINDS, CompileInfo, ConstraintSpec
from .vocab import Vocabulary

__all__ = ["CompileStats", "ConstraintCompiler", "JSON_OBJECT_EBNF", "JSON_OBJECT_MAX_WS",
           "MAX_CHOICE_OPTION_BYTES", "MAX_SOURCE_BYTES", "SMALL_SOURCE_BYTES", "canonical_json"]

#: Largest grammar / regex / schema source and largest total choice list, UTF-8 bytes.
MAX_SOURCE_BYTES = 1 << 20
#: Largest single choice option, UTF-8 bytes.
MAX_CHOICE_OPTION_BYTES = 64 << 10
#: Sources up to this size are admitted while the abandoned-compile pool is full.
SMALL_SOURCE_BYTES = 16 << 10

#: ConstraintError kind for a malformed source, per constraint kind.
_INVALID_KIND = {"grammar": "InvalidGrammar", "regex": "InvalidRegex", "choice": "InvalidChoice",
                 "json_schema": "InvalidSchema", "json_object": "InvalidGrammar"}


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


def _user_input_error(kind: str, exc: BaseException) -> ConstraintError:
    """Map an unexpected exception raised while handling user input to a request error."""
    ek = _INVALID_KIND.get(kind, "InvalidGrammar")
    if isinstance(exc, RecursionError):
        return ConstraintError(ek, f"nesting too deep (the {kind} source exceeds the supported nesting depth)", "")
    if isinstance(exc, MemoryError):
        return ConstraintError(ek, f"the {kind} source is too large to process", "")
    return ConstraintError(ek, f"could not process the {kind} source ({type(exc).__name__}: {exc})", "")

#: Longest whitespace run json_object allows between two JSON tokens (characters).
JSON_OBJECT_MAX_WS = 32

# xgrammar 0.2.9's builtin JSON grammar (Apache-2.0) with the root restricted to
# an object and bounded whitespace runs in the rule bodies.  Its (= ...)
# lookahead hints are what make masks fast: a plain JSON grammar without them
# measured ~100x slower per token (11 ms vs 0.1 ms on a 40k-token vocabulary).
JSON_OBJECT_EBNF = r"""
root ::= "{" ws members_and_embrace
value_non_str ::= ("{" ws members_and_embrace | "[" ws elements_or_embrace | "0" fraction exponent | [1-9] [0-9]* fraction exponent | "-" [0-9] fraction exponent | "-" [1-9] [0-9]* fraction exponent | "true" | "false" | "null") (= [ \n\r\t]* member_suffix_suffix)
members_and_embrace ::= ("\"" characters_and_colon ws members_suffix | "}") (= [ \n\r\t,}\]])
members_suffix ::= (value_non_str ws member_suffix_suffix | "\"" characters_and_embrace | "\"" characters_and_comma ws "\"" characters_and_colon ws members_suffix) (= [ \n\r\t,}\]])
member_suffix_suffix ::= ("}" | "," ws "\"" characters_and_colon ws members_suffix) (= [ \n\r\t,}\]])
elements_or_embrace ::= "{" ws members_and_embrace elements_rest ws "]" | "[" ws elements_or_embrace elements_rest ws "]" | "\"" characters_item elements_rest ws "]" | "0" fraction exponent elements_rest ws "]" | [1-9] [0-9]* fraction exponent elements_rest ws "]" | "-" "0" fraction exponent elements_rest ws "]" | "-" [1-9] [0-9]* fraction exponent elements_rest ws "]" | "true" elements_rest ws "]" | "false" elements_rest ws "]" | "null" elements_rest ws "]" | "]"
elements ::= "{" ws members_and_embrace elements_rest | "[" ws elements_or_embrace elements_rest | "\"" characters_item elements_rest | "0" fraction exponent elements_rest | [1-9] [0-9]* fraction exponent elements_rest | "-" [0-9] fraction exponent elements_rest | "-" [1-9] [0-9]* fraction exponent elements_rest | "true" elements_rest | "false" elements_rest | "null" elements_rest
elements_rest ::= "" | ws "," ws elements
characters_and_colon ::= ("\"" ws ":" | [^"\\\x00-\x1f] characters_and_colon | "\\" escape characters_and_colon) (= [ \n\r\t]* ["{[0-9tfn\-])
characters_and_comma ::= ("\"" ws "," | [^"\\\x00-\x1f] characters_and_comma | "\\" escape characters_and_comma) (= [ \n\r\t]* "\"")
characters_and_embrace ::= ("\"" ws "}" | [^"\\\x00-\x1f] characters_and_embrace | "\\" escape characters_and_embrace) (= [ \n\r\t]* [},])
characters_item ::= ("\"" | [^"\\\x00-\x1f] characters_item | "\\" escape characters_item) (= [ \n\r\t]* [,\]])
escape ::= ["\\/bfnrt] | "u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]
fraction ::= "" | "." [0-9] [0-9]*
exponent ::= "" | "e" sign [0-9] [0-9]* | "E" sign [0-9] [0-9]*
sign ::= "" | "+" | "-"
ws ::= [ \n\r\t]{0,%d}
""" % JSON_OBJECT_MAX_WS

#: The model output wrapper the grammar is compiled for.  Only the plain body
#: exists today; thinking/tool wrappers will get their own ids.
PLAIN_WRAPPER = "plain"

_COMPILE_OPTIONS = {
    "json_object": (f"max_ws={JSON_OBJECT_MAX_WS}",),
    "json_schema": ("separators=,:", "declared-order"),
    "grammar": (),
    "regex": ("fullmatch",),
    "choice": (),
}


class _RawNumber(str):
    """A JSON number kept exactly as written."""


def _dump_canonical(value) -> str:
    if isinstance(value, _RawNumber):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, _Pairs):
        return "{" + ",".join(
            json.dumps(k, ensure_ascii=False) + ":" + _dump_canonical(v) for k, v in value
        ) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump_canonical(v) for v in value) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    raise TypeError(type(value))  # pragma: no cover


class _Pairs(list):
    """A JSON object as its ordered (key, value) pairs (duplicates kept)."""


def canonical_json(text: str) -> str:
    """Compact, order-preserving re-serialisation of JSON text.

    Property order and duplicate keys are kept, numbers are kept as written,
    strings are re-escaped canonically, insignificant whitespace is dropped.

    Raises:
        ConstraintError: ``InvalidSchema`` (location ``""``) if ``text`` is not JSON.
    """
    try:
        value = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_float=_RawNumber,
            parse_int=_RawNumber,
            parse_constant=lambda s: (_ for _ in ()).throw(ValueError(f"{s} is not JSON")),
        )
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {exc.lineno}, column {exc.colno})" if line else ""
        msg = getattr(exc, "msg", str(exc))
        raise ConstraintError("InvalidSchema", f"schema is not valid JSON: {msg}{where}", "") from None
    return _dump_canonical(value)


@dataclass
class CompileStats:
    """Counters since start (monotonic; labels are fixed enums, never content)."""

    hits: int = 0
    built: int = 0
    waited: int = 0
    failures: int = 0
    timeouts: int = 0
    evictions: int = 0


@dataclass
class _Build:
    key: tuple
    finished: threading.Event = field(default_factory=threading.Event)  # worker done
    settled: threading.Event = field(default_factory=threading.Event)  # outcome published
    result: Optional[CompiledConstraint] = None
    error: Optional[BaseException] = None
    abandoned: bool = False  # the owner gave up (deadline); the worker settles late
    started: bool = False  # a worker thread runs / ran it
    native_id: int = 0  # the worker's OS thread id (for re-nicing when abandoned)
    size: int = 0  # source bytes (admission while the abandoned pool is full)


def _regex_grammar(regex: str):
    """Full-match ECMAScript-subset regex → grammar (``constraint_service.regex``).

    Raises:
        ConstraintError: ``InvalidRegex`` with ``line:col``.
    """
    from .regex import regex_to_ebnf

    return XGrammarBackend.parse_ebnf(regex_to_ebnf(regex), kind="InvalidRegex")


def _json_schema_grammar(schema_text: str):
    """JSON Schema → grammar through our schema contract (``constraint_service.json_schema``).

    Raises:
        ConstraintError: ``InvalidSchema`` / ``UnsupportedSchema`` / ``UnsatisfiableSchema`` with a JSON Pointer.
    """
    from .json_schema import json_schema_to_ebnf

    return XGrammarBackend.parse_ebnf(json_schema_to_ebnf(schema_text), kind="InvalidSchema")


class ConstraintCompiler:
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
        fill_threads: threads for xgrammar's batch mask fill.
        max_failures_remembered: size of the per-key failure memory.
    """

    def __init__(self, vocab: Vocabulary, *, cache_bytes: int = 256 << 20,
                 max_cold_compiles: int = 2, compile_timeout_s: float = 10.0,
                 max_abandoned_compiles: Optional[int] = None, fill_threads: int = 2,
                 max_failures_remembered: int = 256) -> None:
        if max_cold_compiles < 1:
            raise ValueError("max_cold_compiles must be >= 1")
        self.vocab = Vocabulary.from_any(vocab)
        self.cache_bytes = int(cache_bytes)
        self.max_cold_compiles = int(max_cold_compiles)
        self.max_abandoned_compiles = (
            self.max_cold_compiles if max_abandoned_compiles is None else int(max_abandoned_compiles)
        )
        self.compile_timeout_s = float(compile_timeout_s)
        self.stats = CompileStats()
        self._fill_threads = fill_threads
        self._max_failures = max_failures_remembered
        self._backend: Optional[XGrammarBackend] = None
        self._backend_lock = threading.Lock()
        self._lock = threading.Lock()  # cache, in-flight, failures, stats
        self._slot_cv = threading.Condition()  # slot accounting
        self._running = 0
        self._abandoned = 0
        self._entries: "OrderedDict[tuple, CompiledConstraint]" = OrderedDict()
        self._bytes = 0
        self._inflight: dict[tuple, _Build] = {}
        self._failures: "OrderedDict[tuple, ConstraintError]" = OrderedDict()
        self._evict_pending = False

    # -- public ---------------------------------------------------------------
    @property
    def backend(self) -> XGrammarBackend:
        """The xgrammar backend; builds the vocabulary index on first use."""
        b = self._backend
        if b is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = XGrammarBackend(self.vocab, fill_threads=self._fill_threads)
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
                ``CompileTimeout``).
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
                return entry, CompileInfo("hit", time.perf_counter() - t0)
            failure = self._failures.get(key)
            if failure is not None:
                self._failures.move_to_end(key)
                raise ConstraintError(failure.kind, failure.message, failure.location)
            build = self._inflight.get(key)
            owner = build is None
            if owner:
                build = _Build(key, size=size)
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
            return build.result, CompileInfo("waited", time.perf_counter() - t0)
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
            raise build.error
        return build.result, CompileInfo("built", time.perf_counter() - t0)

    def clear(self) -> None:
        """Drop every retained grammar and remembered failure (held ones stay alive)."""
        with self._lock:
            for e in self._entries.values():
                e._on_idle = None
            self._entries.clear()
            self._failures.clear()
            self._bytes = 0

    # -- internals ------------------------------------------------------------
    def _key_and_source(self, spec: ConstraintSpec) -> tuple[tuple, object, int]:
        kind = spec.kind
        if kind not in CONSTRAINT_KINDS:
            raise ValueError(f"unknown constraint kind {kind!r}; expected one of {sorted(CONSTRAINT_KINDS)}")
        if kind == "choice":
            if spec.source:
                raise ValueError("choice constraints carry options in `choices`, not `source`")
            options = normalize_choices(spec.choices)
            size = 0
            for idx, option in enumerate(options):
                n = len(option.encode("utf-8"))
                if n > MAX_CHOICE_OPTION_BYTES:
                    raise ConstraintError(
                        "InvalidChoice",
                        f"choice option is {n} bytes; at most {MAX_CHOICE_OPTION_BYTES} bytes per option",
                    )
                size += n
            if size > MAX_SOURCE_BYTES:
                raise ConstraintError(
                    "InvalidChoice",
                    f"choice options total {size} bytes; at most {MAX_SOURCE_BYTES} bytes in all",
                )
            canon: object = options
            text = json.dumps(list(options), ensure_ascii=False)
        else:
            if spec.choices:
                raise ValueError(f"{kind} constraints take no `choices`")
            size = len(spec.source.encode("utf-8", errors="surrogatepass"))
            if size > MAX_SOURCE_BYTES:
                raise ConstraintError(
                    _INVALID_KIND[kind],
                    f"the {kind} source is {size} bytes; at most {MAX_SOURCE_BYTES} bytes",
                )
            if kind == "json_object":
                if spec.source:
                    raise ValueError("json_object takes no source")
                text = canon = ""
            elif kind == "json_schema":
                try:
                    text = canon = canonical_json(spec.source)
                except ConstraintError:
                    raise
                except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on [[[[...]]]]
                    raise _user_input_error(kind, exc) from None
            else:
                text = canon = spec.source
        key = (kind, text, _COMPILE_OPTIONS[kind], PLAIN_WRAPPER, self.vocab.fingerprint())
        return key, canon, size

    def _timeout_error(self, kind: str) -> ConstraintError:
        return ConstraintError(
            "CompileTimeout",
            f"compiling the {kind} constraint took longer than {self.compile_timeout_s:g} s",
            "",
        )

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

    def _run_owned_build(self, build: _Build, kind: str, canon: object,
                         deadline: Optional[float] = None) -> None:
        if deadline is None:
            deadline = time.perf_counter() + self.compile_timeout_s
        backend = self.backend  # lazy vocabulary index, charged to this prepare
        self._acquire_slot(build.size, deadline)
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

    def _worker(self, build: _Build, backend: XGrammarBackend, kind: str, canon: object) -> None:
        build.native_id = threading.get_native_id()
        with self._slot_cv:
            if build.abandoned:  # given up before this thread ran: re-nice ourselves
                _lower_priority(build.native_id)
        result = error = None
        try:
            result = self._build_grammar(backend, kind, canon, build.key)
        except ConstraintError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - user input we failed to convert
            error = _user_input_error(kind, exc)
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

    def _build_grammar(self, backend: XGrammarBackend, kind: str, canon, key: tuple) -> CompiledConstraint:
        if kind == "grammar":
            grammar = parse_gbnf(canon, self.vocab)
        elif kind == "choice":
            grammar = backend.parse_ebnf(choice_to_ebnf(canon), kind="InvalidChoice")
        elif kind == "regex":
            grammar = _regex_grammar(canon)
        elif kind == "json_schema":
            grammar = _json_schema_grammar(canon)
        else:  # json_object
            grammar = backend.parse_ebnf(JSON_OBJECT_EBNF)
        return backend.compile(grammar, kind=kind, key=key)

    def _settle(self, build: _Build) -> None:
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
                if isinstance(err, ConstraintError) and err.kind != "CompileTimeout":
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
