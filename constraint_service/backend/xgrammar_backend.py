"""The xgrammar backend: the one implementation of ``backend.base``'s Protocols.

STYLE "A narrow interface, one class per backend": :class:`XGrammarBackend`
(:class:`~constraint_service.backend.base.Backend`: vocabulary index, EBNF
parsing, compile, new matcher, batch mask fill) and :class:`XGrammarMatcher`
(:class:`~constraint_service.backend.base.Matcher`: ``accept_token``,
``accept_bytes``, ``rollback``, ``fill_bitmask``, ``is_terminated``,
``is_completed``).  This package is the only place in ``constraint_service``
that imports xgrammar (besides ``gbnf.py``, whose GBNF checks walk xgrammar's
parsed grammar); nothing outside sees an xgrammar type.  Another library would
stand beside this module as a second pair.

xgrammar 0.2.9 behaviour worked around here (see also ``vocab.py``):

* ``fill_next_token_bitmask`` may set bits >= V in the last word (seen with
  negated character classes); callers clear them with :attr:`XGrammarBackend.tail_mask`.
* Parse errors are ``RuntimeError("... error at line L, column C: msg")`` with
  a *byte* column; :func:`translate_xgrammar_error` converts it to a
  character column.
* Compiles release the GIL, so a compile on a worker thread does not stall
  the serving threads (measured: a 23 s compile delays other Python threads
  by < 20 ms), and with ``max_threads=1`` xgrammar compiles on the calling
  thread (no pool thread), so the compiler can re-nice an abandoned one; a
  build already proven in a killable worker process may use more threads.
  Each compile uses its own ``GrammarCompiler`` with xgrammar's cache off
  (we have our own), so no compiler-internal lock is shared between compiles.
* Padding ids (``[len(token_bytes), V)``, never allowed) are special tokens to xgrammar, and a fill clears
  them one by one: with SmolLM2's 49,152 tokens padded to V = 128,256 a fill took 30 us on average instead
  of 5.4 (p90 127 vs 16 us; 4 sample schemas x 120 random legal tokens on the 2-core dev box), which made the
  sidecar's Step work at 64 rows 5-6 ms instead of 1.7. From :data:`NARROW_FILL_MIN_PADDING` padding ids
  up, xgrammar gets the tokenizer's own size as its vocabulary, fills a contiguous scratch of that width
  (its fills ignore row strides), and the rows are copied into the V-wide bitmask with the padding words
  zeroed (:meth:`XGrammarBackend.batch_fill`, :meth:`XGrammarMatcher.fill_bitmask`).
* Character classes range over code points *including* the surrogates
  U+D800..U+DFFF: ``[^a]`` or ``[\ud7ff-\ue000]`` accept ``ED A0 80``, which
  is not UTF-8.  :func:`exclude_surrogates` removes them from every class
  before compiling, so outputs contain only Unicode scalar values.
"""

from __future__ import annotations

import json
import re
from typing import Optional, Sequence

import numpy as np
import torch
import xgrammar as xgr

from ninfer_common.constraint_kind import ConstraintKind

from ..errors import ConstraintError
from ..types import bitmask_words
from ..vocab import Vocabulary, encoded_vocab_for_xgrammar
from .base import CompiledConstraint

__all__ = [
    "XGrammarBackend",
    "XGrammarMatcher",
    "exclude_surrogates",
    "translate_xgrammar_error",
]

_POS_RE = re.compile(r"error at line (\d+), column (\d+):\s*(.*)", re.S)
_PREFIX_RE = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


def _clean_message(text: str) -> str:
    text = text.strip()
    text = _PREFIX_RE.sub("", text)
    return text.strip()


def _char_column(source: str, line: int, byte_col: int) -> int:
    """Convert xgrammar's 1-based byte column on ``line`` to a 1-based character column."""
    lines = source.split("\n")
    if not 1 <= line <= len(lines):
        return byte_col
    raw = lines[line - 1].encode("utf-8")
    return len(raw[: max(byte_col - 1, 0)].decode("utf-8", errors="ignore")) + 1


def translate_xgrammar_error(exc: BaseException, source: str, kind: str) -> ConstraintError:
    """Turn an xgrammar parse/compile exception into a :class:`ConstraintError`.

    Args:
        exc: the exception xgrammar raised (usually ``RuntimeError``).
        source: the text xgrammar parsed (for byte -> character columns).
        kind: the ``ConstraintError.kind`` to report.

    Returns:
        The error, with ``location="line:col"`` when xgrammar gave a position.
    """
    text = str(exc)
    m = _POS_RE.search(text)
    if m:
        line, col = int(m.group(1)), int(m.group(2))
        msg = _clean_message(m.group(3)) or "syntax error"
        if msg.endswith("but got"):
            msg += " end of input"
        if 'root rule with name "root" is not found' in msg:
            return ConstraintError(kind, 'missing entry rule "root"', "")
        return ConstraintError(kind, msg, f"{line}:{_char_column(source, line, col)}")
    return ConstraintError(kind, _clean_message(text) or type(exc).__name__, "")


_EXPR_CHAR_CLASS, _EXPR_CHAR_CLASS_STAR = 1, 2
_SURR_LO, _SURR_HI = 0xD800, 0xDFFF


def _class_without_surrogates(negated: int, ranges: list) -> list:
    """Ranges of a character class with U+D800..U+DFFF removed from what it matches."""
    out = []
    if negated:
        out = list(ranges) + [_SURR_LO, _SURR_HI]
        return out
    for k in range(0, len(ranges), 2):
        lo, hi = ranges[k], ranges[k + 1]
        if hi < _SURR_LO or lo > _SURR_HI:
            out += [lo, hi]
            continue
        if lo < _SURR_LO:
            out += [lo, _SURR_LO - 1]
        if hi > _SURR_HI:
            out += [_SURR_HI + 1, hi]
    return out


def exclude_surrogates(grammar: "xgr.Grammar", *, kind: str = "InvalidGrammar") -> "xgr.Grammar":
    """Return ``grammar`` with the surrogate code points removed from every character class.

    Returns the same object when no class can match a surrogate (the common case).

    Raises:
        ConstraintError: ``kind`` if a class matches nothing but surrogates.
    """
    g = GrammarEdit(grammar)
    changed = False
    for k, e in enumerate(g.exprs):
        if e and e[0] in (_EXPR_CHAR_CLASS, _EXPR_CHAR_CLASS_STAR):
            negated, ranges = e[2], e[3: 2 + e[1]]
            pairs = [(ranges[j], ranges[j + 1]) for j in range(0, len(ranges), 2)]
            if negated:  # matches surrogates unless one excluded range covers them all
                fix = not any(lo <= _SURR_LO and hi >= _SURR_HI for lo, hi in pairs)
            else:
                fix = any(not (hi < _SURR_LO or lo > _SURR_HI) for lo, hi in pairs)
            if fix:
                new_ranges = _class_without_surrogates(negated, ranges)
                if not new_ranges:
                    raise ConstraintError(kind, "character class matches only surrogate code points "
                                                "(U+D800..U+DFFF), which are not Unicode scalar values")
                g.exprs[k] = [e[0], 1 + len(new_ranges), negated] + new_ranges
                changed = True
    return g.grammar() if changed else grammar


_EXPR_RULE_REF, _EXPR_SEQUENCE, _EXPR_CHOICES, _EXPR_REPEAT = 4, 5, 6, 8


class GrammarEdit:
    """xgrammar 0.2.9's serialized grammar (``Grammar.serialize_json``, format v18) opened for rewriting:
    ``exprs[k]`` is expression k as a list (``[type, n, ...]``), ``rules`` the rule records. New expressions
    and rules are appended (existing ids stay valid); :meth:`grammar` writes the result back."""

    def __init__(self, grammar: "xgr.Grammar") -> None:
        self.data = json.loads(grammar.serialize_json())
        flat, indptr = self.data["grammar_expr_data"], self.data["grammar_expr_indptr"]
        bounds = list(indptr) + [len(flat)]
        self.exprs: list[list] = [flat[bounds[k]: bounds[k + 1]] for k in range(len(indptr))]
        self.rules: list[list] = self.data["rules"]
        self._names = {r[0] for r in self.rules}

    def add(self, expr: list) -> int:
        """Append an expression; its id."""
        self.exprs.append(expr)
        return len(self.exprs) - 1

    def new_rule(self, base: str, body: int) -> int:
        """Append a rule (no lookahead) named ``base`` or ``base_2``, ``base_3``... (the first unused);
        its id."""
        name, i = base, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        self.rules.append([name, body, -1, False, -1, -1, "", False, None])
        return len(self.rules) - 1

    def grammar(self) -> "xgr.Grammar":
        flat, ptr = [], []
        for e in self.exprs:
            ptr.append(len(flat))
            flat.extend(e)
        self.data["grammar_expr_data"], self.data["grammar_expr_indptr"] = flat, ptr
        return xgr.Grammar.deserialize_json(json.dumps(self.data))


def isolate_multibyte_classes(grammar: "xgr.Grammar") -> "xgr.Grammar":
    """Return ``grammar`` with every character class that can match a non-ASCII character, and that follows a
    rule reference or a repetition in its sequence or is in a lookahead, moved into a rule of its own (the same
    language).

    xgrammar 0.2.9's token masks go wrong for that shape: ``root ::= "a" ("bce" | "ab") [\u4e00-\u9fff] "x"``
    after ``abc`` allows ``er`` (``e`` ends the alternative, ``r`` is no CJK character), which its matcher then
    rejects, ending the request with an integrity error. Over 80 random grammars of that shape (literal,
    alternation, a class of 3-byte characters, a tail; a test vocabulary with tokens across the boundary), 34
    had such masks on 8-token walks; with the class in a rule of its own, none (and 0 of 80 on another seed;
    ``tests/constraint_service/test_regex_dfa.py``). None of 2,018 JSON Schema dev grammars (every fourth) has
    the shape. Returns the same object when nothing applies.
    """
    g = GrammarEdit(grammar)
    out, rules = g.exprs, g.rules
    owner: dict[int, str] = {}  # expr id -> name of a rule whose body holds it (for readable new names)
    for r in rules:
        owner.setdefault(r[1], r[0])

    def multibyte(e: list) -> bool:
        if not e or e[0] not in (_EXPR_CHAR_CLASS, _EXPR_CHAR_CLASS_STAR):
            return False
        ranges = e[3: 2 + e[1]]
        return bool(e[2]) or any(ranges[j + 1] >= 0x80 for j in range(0, len(ranges), 2))

    # a lookahead's sequence: every class in it, its first too (`r ::= ("bce" | "ab") (= [\u4e00-\u9fff] "x")`
    # gave the same unsound masks after `abc` with the SmolLM2 vocabulary; with the class in a rule, none)
    lookaheads = {r[2] for r in rules if r[2] is not None and r[2] >= 0}
    changed = False
    for k in range(len(g.data["grammar_expr_indptr"])):  # the grammar's own expressions, not the added ones
        e = out[k]
        if not e or e[0] != _EXPR_SEQUENCE:
            continue
        items = list(e[2: 2 + e[1]])
        seen_ref = k in lookaheads
        for j, el in enumerate(items):
            kind = out[el][0] if out[el] else None
            if seen_ref and multibyte(out[el]):
                body = g.add([_EXPR_CHOICES, 1, g.add([_EXPR_SEQUENCE, 1, el])])
                items[j] = g.add([_EXPR_RULE_REF, 1, g.new_rule(f"{owner.get(k, 'seq')}_class_{el}", body)])
                changed = True
            if kind in (_EXPR_RULE_REF, _EXPR_REPEAT):
                seen_ref = True
        out[k] = [_EXPR_SEQUENCE, len(items), *items]
    return g.grammar() if changed else grammar


#: padding ids (``V - len(token_bytes)``) from which xgrammar is given the tokenizer's own size (narrow fills;
#: see the module docstring). Below it the per-fill cost of the padding is small (Qwen3: 267 ids).
NARROW_FILL_MIN_PADDING = 1024

#: default rows per batch-fill thread (:class:`XGrammarBackend` ``fill_rows_per_thread``). H200 host, 8 fill
#: threads at most, against always 8: in-process Step p50 16 rows 1.13 -> 0.88 ms (bench/results/
#: step_fill_rows_per_thread_h200host_*.json; at 128 rows both use 8 threads); engine json_schema ITL p50 B=16
#: 1.78 -> 1.55 ms, B=32 2.46 -> 2.15 ms (3 x 300 steps); B=64 (4 threads vs 8) was slower in its one run
#: (sidecar work 2.05 -> 2.20 ms; engine_bench_h200_rows_per_thread*_b*.json): not resolved.
FILL_ROWS_PER_THREAD = 16


class XGrammarBackend:
    """xgrammar behind a narrow interface, bound to one vocabulary.

    Constructing it builds the vocabulary index (``xgrammar.TokenizerInfo``);
    the compiler does that lazily on first constrained use.

    Args:
        vocab: the model vocabulary.
        fill_threads: the most threads :meth:`batch_fill` uses (xgrammar ``BatchGrammarMatcher``).
        fill_rows_per_thread: rows each fill thread must have: a fill of ``n`` rows uses
            :meth:`fill_threads_for` ``(n)`` threads (1 below ``2 * fill_rows_per_thread`` rows); 0 = always
            ``fill_threads``; None or negative = the default (:data:`FILL_ROWS_PER_THREAD`). xgrammar's batch fill
            pays a fixed cost per call for its threads (H200 host, 8 threads: 0.76 ms for 64 rows, 0.89 ms
            for 128; this 2-CPU box: 16 rows in 89 us on 1 thread, ~225 us on 2-8), so a small batch fills
            faster on one thread.
    """

    def __init__(self, vocab: Vocabulary, *, fill_threads: int = 2,
                 fill_rows_per_thread: Optional[int] = FILL_ROWS_PER_THREAD) -> None:
        self.vocab = vocab
        self.vocab_size = vocab.vocab_size
        self.num_words = bitmask_words(vocab.vocab_size)
        rem = vocab.vocab_size % 32
        #: AND-mask for the last word of each row (clears bits >= V); None if V % 32 == 0.
        self.tail_mask: Optional[np.uint32] = (
            np.uint32((1 << rem) - 1) if rem else None
        )
        n = vocab.num_tokenizer_tokens
        narrow = (vocab.vocab_size - n >= NARROW_FILL_MIN_PADDING and n > 0
                  and all(i < n for i in vocab.eos_ids))
        #: the vocabulary size xgrammar knows: V, or the tokenizer's own size when the padding is large
        self.xgr_vocab_size = n if narrow else vocab.vocab_size
        #: words xgrammar writes per row (< num_words: narrow fills through a scratch, the rest zeroed)
        self.fill_words = bitmask_words(self.xgr_vocab_size)
        self._narrow_tail: Optional[np.int32] = (
            np.uint32((1 << (n % 32)) - 1).view(np.int32) if narrow and n % 32 else None)
        self.tokenizer_info = xgr.TokenizerInfo(
            encoded_vocab_for_xgrammar(vocab),
            xgr.VocabType.RAW,
            vocab_size=self.xgr_vocab_size,
            stop_token_ids=list(vocab.eos_ids),
        )
        self.eos_ids = frozenset(vocab.eos_ids)
        self.fill_threads = max(1, int(fill_threads))
        # None or negative: the default (as SidecarOptions and the CLI say)
        rpt = -1 if fill_rows_per_thread is None else int(fill_rows_per_thread)
        self.fill_rows_per_thread = FILL_ROWS_PER_THREAD if rpt < 0 else rpt
        self._batches: dict[int, "xgr.BatchGrammarMatcher"] = {}  # one per thread count in use

    # -- grammar construction -------------------------------------------------
    @staticmethod
    def parse_ebnf(source: str, *, kind: str = "InvalidGrammar") -> "xgr.Grammar":
        """Parse xgrammar EBNF text (entry rule ``root``).

        Raises:
            ConstraintError: ``kind`` with ``line:col`` for syntax errors.
        """
        try:
            return xgr.Grammar.from_ebnf(source)
        except Exception as exc:  # xgrammar raises RuntimeError
            raise translate_xgrammar_error(exc, source, kind) from None

    @staticmethod
    def grammar_to_text(grammar: "xgr.Grammar") -> str:
        """The grammar as text that :meth:`grammar_from_text` reads back (xgrammar's JSON; no token masks,
        so it is small and cheap, unlike a compiled grammar's JSON)."""
        return grammar.serialize_json()

    @staticmethod
    def grammar_from_text(text: str) -> "xgr.Grammar":
        """The grammar :meth:`grammar_to_text` wrote (same xgrammar version).

        Raises:
            RuntimeError: malformed text (xgrammar's ``DeserializeFormatError``).
        """
        return xgr.Grammar.deserialize_json(text)

    @staticmethod
    def concat(grammars: Sequence["xgr.Grammar"]) -> "xgr.Grammar":
        """The concatenation of the grammars' languages (xgrammar renames clashing rules)."""
        return xgr.Grammar.concat(*grammars)

    def compile(self, grammar: "xgr.Grammar", *, kind: ConstraintKind | str, key: tuple,
                error_kind: str = "InvalidGrammar", threads: int = 1) -> CompiledConstraint:
        """Compile a parsed grammar against this vocabulary (GIL released).

        Surrogate code points are removed from character classes first
        (:func:`exclude_surrogates`), and non-ASCII classes after a rule reference get a rule of their own
        (:func:`isolate_multibyte_classes`, an xgrammar 0.2.9 mask bug).

        Args:
            grammar: from :meth:`parse_ebnf` (or ``gbnf.parse_gbnf``).
            kind: the constraint kind (kept on the result).
            key: the cache key (kept on the result).
            error_kind: the ``ConstraintError`` kind of a rejected grammar (the
                registry entry's ``error_kind``).
            threads: xgrammar's ``max_threads``: 1 compiles on the calling thread; more build the
                token-mask cache on xgrammar's own pool (on the H200 host's 16 cores, 68 dev schemas:
                p50 339 ms with 1, 93 ms with 4, 50 ms with 8; bench/results/compile_threads_h200host.json).

        Raises:
            ConstraintError: ``error_kind`` when xgrammar rejects it at compile time.
        """
        source = grammar
        grammar = isolate_multibyte_classes(exclude_surrogates(grammar, kind=error_kind))
        compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=max(1, int(threads)), cache_enabled=False)
        try:
            compiled = compiler.compile_grammar(grammar)
        except Exception as exc:
            raise translate_xgrammar_error(exc, "", error_kind) from None
        return CompiledConstraint(kind, key, self, compiled, compiled.memory_size_bytes, grammar=source)

    def new_matcher(self, compiled: "xgr.CompiledGrammar") -> "XGrammarMatcher":
        """A fresh matcher at the start of ``compiled``'s language."""
        return XGrammarMatcher(xgr.GrammarMatcher(compiled), self)

    def batch_accept(self, matchers: Sequence["XGrammarMatcher"], tokens: Sequence[int]) -> list[bool]:
        """Accept ``tokens[j]`` in ``matchers[j]`` through xgrammar's ``BatchGrammarMatcher.batch_accept_token``
        (one call instead of one per row on the Step path).

        Args:
            matchers: this backend's matchers, none terminated, each at most once.
            tokens: ``[len(matchers)]`` ids in ``[0, V)``; a padding id of a narrow backend
                (>= :attr:`xgr_vocab_size`) is refused without asking xgrammar, as :meth:`XGrammarMatcher.accept_token`.

        Returns:
            per matcher: accepted (a refused token leaves its matcher unchanged).
        """
        limit = self.xgr_vocab_size
        toks = [int(t) for t in tokens]
        if len(toks) != len(matchers):
            raise ValueError(f"batch_accept: {len(matchers)} matchers, {len(toks)} tokens")
        keep = [j for j, t in enumerate(toks) if t < limit]
        if len(keep) == len(toks):
            return xgr.BatchGrammarMatcher.batch_accept_token([m._m for m in matchers], toks)
        out = [False] * len(toks)
        if keep:
            got = xgr.BatchGrammarMatcher.batch_accept_token([matchers[j]._m for j in keep], [toks[j] for j in keep])
            for j, ok in zip(keep, got):
                out[j] = ok
        return out

    # -- masks ----------------------------------------------------------------
    def batch_fill(self, matchers: Sequence["XGrammarMatcher"], bitmask: torch.Tensor,
                   indices: list[int]) -> None:
        """Fill ``bitmask[indices[j]]`` for ``matchers[j]`` with xgrammar's thread pool.

        Args:
            matchers: matchers, none terminated.
            bitmask: ``[rows, W]`` int32 CPU tensor (a view of the ring's uint32 words).
            indices: row index per matcher.

        Bits >= V are *not* cleared here; see :attr:`tail_mask`. A narrow backend (:attr:`xgr_vocab_size`
        < V) fills a scratch and copies it in (:meth:`narrow_fill`).
        """
        ms = [m._m for m in matchers]
        batch = self._batch_matcher(self.fill_threads_for(len(ms)))
        if self.fill_words == self.num_words:
            batch.batch_fill_next_token_bitmask(ms, bitmask, indices)
        else:
            self.narrow_fill(lambda scratch, rows: batch.batch_fill_next_token_bitmask(ms, scratch, rows),
                             bitmask, indices)

    def fill_threads_for(self, rows: int) -> int:
        """Threads :meth:`batch_fill` uses for ``rows`` rows: ``rows // fill_rows_per_thread``, 1 to
        :attr:`fill_threads` (always :attr:`fill_threads` when ``fill_rows_per_thread`` is 0)."""
        if self.fill_rows_per_thread == 0:
            return self.fill_threads
        return max(1, min(self.fill_threads, int(rows) // self.fill_rows_per_thread))

    def _batch_matcher(self, threads: int) -> "xgr.BatchGrammarMatcher":
        b = self._batches.get(threads)
        if b is None:
            b = self._batches.setdefault(threads, xgr.BatchGrammarMatcher(threads))
        return b

    def narrow_fill(self, fill, bitmask: torch.Tensor, indices: Sequence[int]) -> None:
        """Rows ``indices`` of the ``[rows, W]`` int32 ``bitmask`` from ``fill(scratch, rows)``, which writes
        rows ``0..k-1`` of a contiguous ``[k, fill_words]`` int32 scratch: bits >= :attr:`xgr_vocab_size`
        cleared, words from ``fill_words`` on set to 0 (padding ids are never allowed)."""
        k = len(indices)
        scratch = torch.empty((k, self.fill_words), dtype=torch.int32)
        fill(scratch, list(range(k)))
        sc = scratch.numpy()
        if self._narrow_tail is not None:
            sc[:, -1] &= self._narrow_tail
        out = bitmask.numpy()
        rows = np.asarray(indices, dtype=np.intp)
        out[rows, : self.fill_words] = sc
        out[rows, self.fill_words:] = 0


class XGrammarMatcher:
    """One request's mutable grammar state (never shared between requests)."""

    __slots__ = ("_m", "backend", "_limit")

    def __init__(self, matcher: "xgr.GrammarMatcher", backend: XGrammarBackend) -> None:
        self._m = matcher
        self.backend = backend
        self._limit = backend.xgr_vocab_size  # ids from here on: padding of a narrow backend, never allowed

    def accept_token(self, token_id: int) -> bool:
        """Accept one token id; False (state unchanged) if the grammar rejects it (a padding id too)."""
        token_id = int(token_id)
        return token_id < self._limit and self._m.accept_token(token_id)

    def accept_bytes(self, data: bytes) -> bool:
        """Accept raw bytes (may split a UTF-8 character); one rollback step."""
        return self._m.accept_string(bytes(data))

    def rollback(self, num_steps: int) -> None:
        """Undo the last ``num_steps`` accepted tokens (no-op for 0)."""
        if num_steps > 0:
            self._m.rollback(num_steps)

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next-token set into ``bitmask[index]``.

        Args:
            bitmask: ``[rows, W]`` int32 CPU tensor.
            index: row to fill.  Bits >= V may be set; clear with ``backend.tail_mask``.
        """
        backend = self.backend
        if backend.fill_words == backend.num_words:
            self._m.fill_next_token_bitmask(bitmask, index)
        else:
            backend.narrow_fill(lambda scratch, rows: self._m.fill_next_token_bitmask(scratch, rows[0]),
                                bitmask, [index])

    def is_terminated(self) -> bool:
        """EOS was accepted."""
        return self._m.is_terminated()

    def is_completed(self) -> bool:
        """The input so far is a complete sentence ("allowed to end")."""
        return self._m.is_completed()
