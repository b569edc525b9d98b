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
  daemon worker thread (xgrammar releases the GIL while compiling).  A second
  request for a key being built waits for that build (``"waited"``); hits
  take no slot (``"hit"``).
* Compile deadline (default 10 s).  xgrammar cannot cancel a compile, so on
  timeout the request fails with ``CompileTimeout`` and the worker thread is
  *abandoned*: its slot moves to a separate pool of at most
  ``max_abandoned_compiles`` (default = ``max_cold_compiles``) so new cold
  compiles are not blocked; when that pool is full the slot stays held until
  the thread really ends, which bounds CPU use at
  ``max_cold_compiles + max_abandoned_compiles`` compile threads.  The late
  result is discarded.  Build failures (including timeouts) are remembered
  per key (bounded LRU) so a repeated pathological request fails fast.
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
           "canonical_json"]

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
    abandoned: bool = False
    holds_slot: bool = True  # False once moved to the abandoned pool


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
            without holding a slot (default: ``max_cold_compiles``).
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
        key, canon = self._key_and_source(spec)
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
                build = _Build(key)
                self._inflight[key] = build
        if not owner:
            build.settled.wait()
            with self._lock:
                self.stats.waited += 1
            if build.error is not None:
                err = build.error
                if isinstance(err, ConstraintError):
                    raise ConstraintError(err.kind, err.message, err.location)
                raise err
            return build.result, CompileInfo("waited", time.perf_counter() - t0)
        try:
            self._run_owned_build(build, spec.kind, canon)
        except BaseException as exc:  # noqa: BLE001 - e.g. the vocabulary index failed
            build.result, build.error = None, exc
        finally:
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
    def _key_and_source(self, spec: ConstraintSpec) -> tuple[tuple, object]:
        kind = spec.kind
        if kind not in CONSTRAINT_KINDS:
            raise ValueError(f"unknown constraint kind {kind!r}; expected one of {sorted(CONSTRAINT_KINDS)}")
        if kind == "choice":
            if spec.source:
                raise ValueError("choice constraints carry options in `choices`, not `source`")
            options = normalize_choices(spec.choices)
            canon: object = options
            text = json.dumps(list(options), ensure_ascii=False)
        else:
            if spec.choices:
                raise ValueError(f"{kind} constraints take no `choices`")
            if kind == "json_object":
                if spec.source:
                    raise ValueError("json_object takes no source")
                text = canon = ""
            elif kind == "json_schema":
                text = canon = canonical_json(spec.source)
            else:
                text = canon = spec.source
        key = (kind, text, _COMPILE_OPTIONS[kind], PLAIN_WRAPPER, self.vocab.fingerprint())
        return key, canon

    def _acquire_slot(self) -> None:
        with self._slot_cv:
            while self._running >= self.max_cold_compiles:
                self._slot_cv.wait()
            self._running += 1

    def _run_owned_build(self, build: _Build, kind: str, canon: object) -> None:
        backend = self.backend  # lazy vocabulary index, charged to this prepare
        self._acquire_slot()
        worker = threading.Thread(
            target=self._worker, args=(build, backend, kind, canon),
            name=f"ninfer-compile-{kind}", daemon=True,
        )
        try:
            worker.start()
        except BaseException:
            with self._slot_cv:
                self._running -= 1
                self._slot_cv.notify_all()
            raise
        done = build.finished.wait(self.compile_timeout_s)
        with self._slot_cv:
            if not done and not build.finished.is_set():
                build.abandoned = True
                build.error = ConstraintError(
                    "CompileTimeout",
                    f"compiling the {kind} constraint took longer than "
                    f"{self.compile_timeout_s:g} s",
                    "",
                )
                if self._abandoned < self.max_abandoned_compiles:
                    build.holds_slot = False
                    self._running -= 1
                    self._abandoned += 1
                    self._slot_cv.notify_all()

    def _worker(self, build: _Build, backend: XGrammarBackend, kind: str, canon: object) -> None:
        result = error = None
        try:
            result = self._build_grammar(backend, kind, canon, build.key)
        except BaseException as exc:  # noqa: BLE001 - reported to the owner
            error = exc
        with self._slot_cv:
            if build.holds_slot:
                self._running -= 1
            else:
                self._abandoned -= 1
            if not build.abandoned:
                build.result, build.error = result, error
            build.finished.set()
            self._slot_cv.notify_all()

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
        if build.result is None and build.error is None:
            build.error = ConstraintError("CompileTimeout", "compile did not finish", "")
        with self._lock:
            self._inflight.pop(build.key, None)
            if build.result is not None:
                self.stats.built += 1
                self._insert_locked(build.result)
            else:
                self.stats.failures += 1
                err = build.error
                if isinstance(err, ConstraintError):
                    if err.kind == "CompileTimeout":
                        self.stats.timeouts += 1
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
