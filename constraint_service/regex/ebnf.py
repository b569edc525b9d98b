"""EBNF emission (xgrammar dialect) for regex ASTs and DFAs, raw text or JSON-string-escaped."""
from __future__ import annotations

import functools
import json

from . import charset as cs

# characters that are written verbatim inside a canonical JSON string
JSON_PLAIN = cs.subtract(cs.ANY, cs.normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]))
_NAMED = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def json_escape_char(cp: int) -> str:
    """Canonical JSON escape of one code point (as json.dumps(ensure_ascii=False))."""
    if cp in _NAMED:
        return _NAMED[cp]
    if cp < 0x20:
        return "\\u%04x" % cp
    return chr(cp)


def _cp(c: int) -> str:
    return "\\u%04x" % c if c <= 0xFFFF else "\\U%08x" % c


_CARET = 0x5E


def class_text(ranges) -> str:
    """A positive character class of exactly ``ranges`` (a normalized charset), every member ``\\u``-escaped.

    xgrammar 0.2.9 *prints* a class whose first member is ``^`` without escaping it (``[\\u005e\\u0061]``
    prints as ``[^a]``, ``[\\u005e-\\u0061]`` as ``[^-a]``), and a ``GrammarCompiler`` with its cache on
    compiles a ``Grammar`` from that printed text: the negated class. NInfer's compilers run with the cache
    off (the right language), but the text must survive printing, so a class whose first code point is U+005E
    writes that member last; the one-member class ``[\\u005e]`` parses (and prints) as ``"^"`` and stays.
    """
    if tuple(ranges) == ((0, 0),):
        # xgrammar 0.2.9 Grammar.from_ebnf turns a one-char class [\u0000] into the empty
        # literal "" (NUL-terminated string); a duplicated member keeps it a class.
        return "[\\u0000\\u0000]"
    ranges = list(ranges)
    if ranges and ranges[0][0] == _CARET and ranges != [(_CARET, _CARET)]:
        hi = ranges[0][1]
        ranges = ([(_CARET + 1, hi)] if hi > _CARET else []) + ranges[1:] + [(_CARET, _CARET)]
    parts = []
    for lo, hi in ranges:
        parts.append(_cp(lo) if lo == hi else _cp(lo) + "-" + _cp(hi))
    return "[" + "".join(parts) + "]"


def json_literal(v) -> str:
    """EBNF string literal of the compact JSON text of ``v`` (the canonical generation form)."""
    return ebnf_string(json.dumps(v, ensure_ascii=False, separators=(",", ":")))


def ebnf_string(text: str) -> str:
    out = ['"']
    for ch in text:
        c = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= c < 0x7F:
            out.append(ch)
        else:
            out.append(_cp(c))
    out.append('"')
    return "".join(out)


def charset_raw(ranges) -> str:
    """A character class of exactly ``ranges`` (a normalized charset), negated when that takes fewer
    ranges: xgrammar 0.2.9 has a fast path for the repetition of a negated class (``[^\\n]{0,300}``: 6 ms per
    mask, against 180 ms as the positive class of its three ranges; ``bench/regex_bench.py``)."""
    if not ranges:
        return "[]"
    missing = cs.subtract(cs.ANY, ranges)
    if missing and len(missing) < len(ranges):
        return "[^" + "".join(_cp(lo) if lo == hi else _cp(lo) + "-" + _cp(hi) for lo, hi in missing) + "]"
    return class_text(ranges)


@functools.lru_cache(maxsize=4096)
def charset_json(ranges) -> str:
    """Expression matching the canonical JSON-string encoding of one char of `ranges` (a normalized
    charset; cached by its value)."""
    alts = []
    plain = cs.intersect(ranges, JSON_PLAIN)
    if plain:
        alts.append(class_text(plain))
    specials = [c for c in list(range(0x20)) + [0x22, 0x5C] if cs.contains(ranges, c)]
    named = [c for c in specials if c in _NAMED]
    for c in named:
        alts.append(ebnf_string(_NAMED[c]))
    other = [c for c in specials if c not in _NAMED]
    lo_digits = [c for c in other if c < 0x10]
    hi_digits = [c - 0x10 for c in other if 0x10 <= c < 0x20]
    if lo_digits:
        alts.append('"\\\\u000" ' + class_text(cs.normalize(
            [(ord("%x" % d), ord("%x" % d)) for d in lo_digits])))
    if hi_digits:
        alts.append('"\\\\u001" ' + class_text(cs.normalize(
            [(ord("%x" % d), ord("%x" % d)) for d in hi_digits])))
    if not alts:
        return "[]"
    if len(alts) == 1:
        return alts[0]
    return "(" + " | ".join(alts) + ")"


# Bounded repetition. xgrammar 0.2.9 evaluates `X{m,n}` of anything but a plain character class at
# match time (measured with the SmolLM2 vocabulary: 0.1 s per mask for `j_char{1,}`, 0.5-1 s for
# `j_char{0,255}`), so a small lower bound is always written out as copies followed by `X*` (same
# language, precompiled masks). With expand=True every bound up to EXPAND_LIMIT is written out (copies,
# then nested optionals): the same language again, used where masks are computed lazily (the fuzz
# harness compiles with enable_dynamic_compilation); eager compilation of long expansions is costly.
COPY_LIMIT = 32
EXPAND_LIMIT = 256  # nested optionals: xgrammar's parser allows ~1,000 nesting levels
# xgrammar 0.2.9 gets the masks of a counted repetition of a character class wrong past 128: they allow tokens
# its matcher then rejects. SmolLM2 vocabulary, first mask or a walk: `[\u0009\u000b-\ud7ff\ue000-\U0010ffff]{0,129}`
# allows 39 tokens with a newline (" \n", "\r\n"; `{0,128}`: none), `[ 0-9A-Za-z\u4e00-\u9fff]{0,200}` 1,356 over
# 18 positions, `[a-z\u4e00-\u9fff]{0,600}` 25 ("assertEqual"), `[ -~\u00a0-\u00ff\u0400-\u04ff]{0,600}` 12 (" \n"),
# the negated `[^\u4e00-\u9fff]{0,600}` 6 (" \xe5": a CJK character's first bytes). So a raw (regex constraint, GBNF)
# repetition over REPEAT_PIECE is written as counts of at most REPEAT_PIECE (repeat_chain): x{0,300} =
# (x{0,127} | x{128,128} (x{0,127} | x{128,128} x{0,44})), the same language and unambiguous (each alternative
# takes lengths the other does not), so one parse per prefix; sound in the same checks. A first version wrote
# the sequence x{0,128} x{0,128} x{0,44} (ambiguous: every split of the length is a parse), whose masks took
# 4.1 ms for [a-z ]{0,300} and 95 ms for [a-z ]{0,5000} against 0.09 ms for this form (SmolLM2 vocabulary,
# median over a 40-token walk, the 2-core box under load).
REPEAT_PIECE = 128
#: Past this many alternation levels the regex text writes the flat (ambiguous, slower) sequence instead: the
#: levels nest, and xgrammar's parser allows ~1,000 nesting levels in one rule.
CHAIN_NEST_LIMIT = 32


def repeat_chain(lo: int, hi: int | None) -> tuple[int, list[tuple[int, int | None]]]:
    """``(q, levels)`` with ``x{lo,hi}`` = ``x{128,128}`` q times, then ``C_0``, where ``C_k`` =
    ``x{l_k,127} | x{128,128} C_k+1`` for every level but the last, and the last ``C`` = ``x{l,h}`` (``h``
    None: unbounded). Every count is at most :data:`REPEAT_PIECE`; a count already within it gives
    ``(0, [(lo, hi)])``; a last level ``(0, 0)`` is the empty string. Raises ``ValueError`` unless
    ``0 <= lo <= hi``.

    The lengths are exactly lo..hi: ``C_k`` takes ``[l_k, 127]`` or ``128 + C_k+1``'s, disjoint ranges
    (so each length has one parse), and together contiguous.
    """
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"repeat counts need 0 <= lo <= hi, got {lo}, {hi}")
    if lo <= REPEAT_PIECE and (hi is None or hi <= REPEAT_PIECE):
        return 0, [(lo, hi)]
    q = lo // REPEAT_PIECE
    lo -= q * REPEAT_PIECE
    if hi is None:
        return q, [(lo, None)]
    hi -= q * REPEAT_PIECE
    levels: list[tuple[int, int | None]] = []
    while hi > REPEAT_PIECE:
        levels.append((lo, REPEAT_PIECE - 1))
        hi -= REPEAT_PIECE
        lo = 0
    levels.append((lo, hi))
    return q, levels


def repeat_pieces(lo: int, hi: int | None) -> list[tuple[int, int | None]]:
    """The counts ``[(lo_i, hi_i)]`` of a sequence of counted repetitions equal to ``x{lo,hi}``, none of them
    over :data:`REPEAT_PIECE` (hi None: unbounded, the last piece only): x^i x^j = x^(i+j), so the lengths are
    exactly lo..hi, but a length has many parses. Used only past :data:`CHAIN_NEST_LIMIT` levels.

    Raises:
        ValueError: unless ``0 <= lo <= hi``.
    """
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"repeat counts need 0 <= lo <= hi, got {lo}, {hi}")
    out = []
    while lo > REPEAT_PIECE or (hi is not None and hi > REPEAT_PIECE):
        n = min(lo, REPEAT_PIECE)
        h = REPEAT_PIECE if hi is not None or n < lo else n
        out.append((n, h))
        lo -= n
        if hi is not None:
            hi -= h
    if hi != 0 or not out:
        out.append((lo, hi))
    return out


def _count(x: str, lo: int, hi: int | None) -> str:
    return f"{x}{{{lo},{'' if hi is None else hi}}}"


def _pieces(x: str, lo: int, hi: int | None) -> str:
    """x{lo,hi} with no count over REPEAT_PIECE: :func:`repeat_chain` as nested groups, or past
    :data:`CHAIN_NEST_LIMIT` levels the flat sequence of :func:`repeat_pieces`."""
    q, levels = repeat_chain(lo, hi)
    if len(levels) - 1 > CHAIN_NEST_LIMIT:
        return "(" + " ".join(_count(x, a, b) for a, b in repeat_pieces(lo, hi)) + ")"
    last = levels[-1]
    e = _count(x, *last) if last != (0, 0) else '""'
    for a, b in reversed(levels[:-1]):
        e = f"({_count(x, a, b)} | {_count(x, REPEAT_PIECE, REPEAT_PIECE)} {e})"
    return "(" + " ".join([_count(x, REPEAT_PIECE, REPEAT_PIECE)] * q + [e]) + ")"


def repeat(x: str, lo: int, hi: int | None, expand: bool = False, split: bool = False) -> str:
    """EBNF for x{lo,hi} (hi None = unbounded); x must be an atom (a name or a parenthesised group).
    ``split``: counts over REPEAT_PIECE are written in pieces (:data:`REPEAT_PIECE`)."""
    if hi is not None and hi < lo:
        return "[]"
    if hi == 0:
        return '""'
    if hi is None and (lo <= COPY_LIMIT or (expand and lo <= EXPAND_LIMIT)):
        return " ".join([x] * lo + [f"{x}*"])
    if expand and hi is not None and hi <= EXPAND_LIMIT:
        opt = ""
        for _ in range(hi - lo):
            opt = f"({x} {opt})?" if opt else f"({x})?"
        parts = [x] * lo + ([opt] if opt else [])
        return "(" + " ".join(parts) + ")"
    if split and (lo > REPEAT_PIECE or (hi is not None and hi > REPEAT_PIECE)):
        return _pieces(x, lo, hi)
    return f"{x}{{{lo},{'' if hi is None else hi}}}"


def ast_to_expr(node, json_mode: bool, expand: bool = False) -> str:
    kind = node[0]
    if kind == "chars":
        return charset_json(node[1]) if json_mode else charset_raw(node[1])
    if kind == "cat":
        if not node[1]:
            return '""'
        parts = [ast_to_expr(c, json_mode, expand) for c in node[1]]
        return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"
    if kind == "alt":
        return "(" + " | ".join(ast_to_expr(c, json_mode, expand) for c in node[1]) + ")"
    if kind == "rep":
        _, sub, lo, hi = node
        inner = ast_to_expr(sub, json_mode, expand)
        if (lo, hi) == (0, None):
            return "(" + inner + ")*"
        if (lo, hi) == (1, None):
            return "(" + inner + ")+"
        if (lo, hi) == (0, 1):
            return "(" + inner + ")?"
        if hi == 0:
            return '""'
        if (lo, hi) == (1, 1):
            return inner
        # counts over REPEAT_PIECE as the unambiguous chain, in both modes: a JSON Schema `pattern` over the DFA
        # limit (emit.py) got xgrammar's unsound masks too (^[a-z\u4e00-\u9fff]{0,600}$: 25 SmolLM2 tokens such
        # as "assertFalse" allowed after the opening quote, then rejected)
        return "(" + repeat("(" + inner + ")", lo, hi, expand, split=True) + ")"
    raise ValueError(kind)


def dfa_rule_bodies(dfa, state_name, char_alts, accept_alt: str, lookahead: str = "") -> list[tuple[str, str]]:
    """A DFA as right-linear EBNF rules, one per state: ``[(rule name, body)]`` in state order.

    Args:
        dfa: an ``automaton.DFA`` (state 0 starts).
        state_name: state number -> rule name.
        char_alts: a transition's ranges -> the expressions matching one character of them (each is
            followed by the target state's rule).
        accept_alt: the alternative that ends the language at an accepting state (``'""'``, or a closing
            quote).
        lookahead: xgrammar's lookahead assertion on every rule that has alternatives (what may follow
            the language). Every rule ends where the language ends, so this lets xgrammar decide at
            compile time the tokens that run past the end of a state's rule, which it otherwise checks
            at match time for every mask.

    A state without alternatives (the empty language) is the empty class ``[]``.
    """
    out = []
    for st, tr in enumerate(dfa.trans):
        alts = [accept_alt] if st in dfa.accept else []
        for ranges, t in tr:
            alts.extend(f"{e} {state_name(t)}" for e in char_alts(ranges))
        body = " | ".join(alts) or "[]"
        out.append((state_name(st), body + (f" {lookahead}" if alts and lookahead else "")))
    return out
