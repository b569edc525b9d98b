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


def class_text(ranges) -> str:
    if tuple(ranges) == ((0, 0),):
        # xgrammar 0.2.9 Grammar.from_ebnf turns a one-char class [\u0000] into the empty
        # literal "" (NUL-terminated string); a duplicated member keeps it a class.
        return "[\\u0000\\u0000]"
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
    if not ranges:
        return "[]"
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


def repeat(x: str, lo: int, hi: int | None, expand: bool = False) -> str:
    """EBNF for x{lo,hi} (hi None = unbounded); x must be an atom (a name or a parenthesised group)."""
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
        return "(" + repeat("(" + inner + ")", lo, hi, expand) + ")"
    raise ValueError(kind)
