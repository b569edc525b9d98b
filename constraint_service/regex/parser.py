"""A small ECMAScript-subset regex parser, written for NInfer.

Dialect: ECMAScript (ECMA-262) patterns with the ``u`` flag, for both the
regex constraint and JSON Schema ``pattern`` / ``patternProperties`` (JSON
Schema 2020-12 core §6.4 asks for ECMA-262 with Unicode semantics; issue 13
"Regex dialect").  Consequences of the ``u`` flag, each a located error:

* lone ``{``, ``}`` and ``]`` and incomplete quantifiers (``a{``, ``a{,3}``,
  ``a{2``) are syntax errors -- there is no Annex B "literal brace" fallback;
* identity escapes only for syntax characters ``^$\\.*+?()[]{}|/`` (and
  ``-`` inside a class): ``\\q``, ``\\:``, ``\\@`` are errors;
* ``\\u{X...}`` code point escapes and ``\\uD83D\\uDE00`` surrogate pairs
  denote one code point; a lone surrogate escape is an error;
* no flags (the pattern is compiled without ``i``/``m``/``s``/``y``/``g``);
  ``.`` excludes the four line terminators.

AST nodes (tuples):
  ("chars", ranges)            one code point from a charset
  ("cat", [nodes])             concatenation (empty list = empty string)
  ("alt", [nodes])             alternation
  ("rep", node, min, max|None) counted repetition (greedy and lazy are the same language)

A parsed pattern is a list of top-level alternatives (anchored_start, anchored_end, node).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConstraintError
from . import charset as cs

EMPTY_NODE = ("cat", [])
MAX_REPEAT = 100_000

SYNTAX_CHARS = set("^$\\.*+?()[]{}|/")
_IDENTITY_ESCAPES = frozenset("^$\\.*+?()[]{}|/")  # ECMA-262 u-mode IdentityEscape
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass
class ParsedRegex:
    pattern: str
    alternatives: list  # [(anchored_start, anchored_end, node)]


class RegexSyntaxError(ConstraintError):
    pass


def _loc(pattern: str, pos: int) -> str:
    line = pattern.count("\n", 0, pos) + 1
    start = pattern.rfind("\n", 0, pos) + 1
    return f"{line}:{pos - start + 1}"


class _Parser:
    def __init__(self, pattern: str, kind: str, unsupported_kind: str | None = None):
        self.p = pattern
        self.i = 0
        self.n = len(pattern)
        self.kind = kind
        self.unsupported_kind = unsupported_kind or kind

    def err(self, msg: str, pos: int | None = None, unsupported: bool = False):
        """Raise the located error: ``kind`` for malformed syntax, ``unsupported_kind`` for valid
        ECMAScript this dialect does not support (``unsupported=True``)."""
        pos = self.i if pos is None else pos
        raise ConstraintError(self.unsupported_kind if unsupported else self.kind,
                              f"{msg} at column {_loc(self.p, pos).split(':')[1]}", _loc(self.p, pos))

    def peek(self, k: int = 0):
        j = self.i + k
        return self.p[j] if j < self.n else None

    # ---- top level -------------------------------------------------------
    def parse_top(self) -> list:
        alts = []
        while True:
            alts.append(self.parse_top_alternative())
            if self.peek() == "|":
                self.i += 1
                continue
            if self.peek() == ")":
                self.err("unmatched ')'")
            break
        return alts

    def parse_top_alternative(self):
        anchored_start = False
        while self.peek() == "^":
            anchored_start = True
            self.i += 1
        items = []
        anchored_end = False
        while True:
            c = self.peek()
            if c is None or c == "|" or c == ")":
                break
            if c == "$":
                # must be followed only by more '$' up to the end of the alternative
                j = self.i
                while j < self.n and self.p[j] == "$":
                    j += 1
                if j < self.n and self.p[j] not in "|)":
                    self.err("'$' is only allowed at the end of the expression or of a top-level alternative")
                if j < self.n and self.p[j] == "?" or (j < self.n and self.p[j] in "*+{"):
                    self.err("nothing to repeat", j)
                anchored_end = True
                self.i = j
                break
            items.append(self.parse_quantified())
        return (anchored_start, anchored_end, ("cat", items) if len(items) != 1 else items[0])

    # ---- nested ----------------------------------------------------------
    def parse_alternation(self):
        alts = [self.parse_sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.parse_sequence())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def parse_sequence(self):
        items = []
        while True:
            c = self.peek()
            if c is None or c == "|" or c == ")":
                break
            items.append(self.parse_quantified())
        return items[0] if len(items) == 1 else ("cat", items)

    def parse_quantified(self):
        start = self.i
        atom = self.parse_atom()
        while True:
            c = self.peek()
            q = None
            qpos = self.i
            if c == "*":
                q = (0, None)
                self.i += 1
            elif c == "+":
                q = (1, None)
                self.i += 1
            elif c == "?":
                q = (0, 1)
                self.i += 1
            elif c == "{":
                q = self.try_braces()
                if q is None:
                    self.err("incomplete quantifier: expected {n}, {n,} or {n,m} "
                             "(write \\{ for the character)", qpos)
            if q is None:
                break
            if self.peek() == "?":
                self.i += 1  # lazy: same language
            lo, hi = q
            if hi is not None and lo > hi:
                self.err("numbers out of order in {} quantifier", qpos)
            if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
                self.err(f"repetition count above {MAX_REPEAT}", qpos, unsupported=True)
            if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._braces_ahead()):
                # ECMAScript: a quantifier cannot follow a quantifier (a** is a syntax error)
                self.err("nothing to repeat")
            atom = ("rep", atom, lo, hi)
            break
        del start
        return atom

    def _braces_ahead(self):
        save = self.i
        r = self.try_braces()
        self.i = save
        return r is not None

    def try_braces(self):
        # returns (lo, hi) and advances, or None (not a complete quantifier: an error in u-mode)
        j = self.i + 1
        k = j
        while k < self.n and self.p[k].isdigit() and self.p[k].isascii():
            k += 1
        if k == j:
            return None
        lo = int(self.p[j:k])
        if k < self.n and self.p[k] == "}":
            self.i = k + 1
            return (lo, lo)
        if k < self.n and self.p[k] == ",":
            m = k + 1
            while m < self.n and self.p[m].isdigit() and self.p[m].isascii():
                m += 1
            if m < self.n and self.p[m] == "}":
                hi = int(self.p[k + 1:m]) if m > k + 1 else None
                self.i = m + 1
                return (lo, hi)
        return None

    def parse_atom(self):
        c = self.peek()
        pos = self.i
        if c in ("*", "+", "?"):
            self.err("nothing to repeat")
        if c == "{":
            if self._braces_ahead():
                self.err("nothing to repeat")
            self.err("lone '{' (incomplete quantifier or unescaped brace; write \\{ for the character)")
        if c == "}":
            self.err("lone '}' (write \\} for the character)")
        if c == "]":
            self.err("lone ']' (write \\] for the character)")
        if c == "^":
            self.err("'^' is only allowed at the start of the expression or of a top-level alternative")
        if c == "$":
            self.err("'$' is only allowed at the end of the expression or of a top-level alternative")
        if c == "(":
            return self.parse_group()
        if c == "[":
            return ("chars", self.parse_class())
        if c == ".":
            self.i += 1
            return ("chars", cs.DOT)
        if c == "\\":
            r = self.parse_escape(in_class=False)
            return ("chars", r)
        # literal
        self.i += 1
        cp = ord(c)
        if cs.SURR_LO <= cp <= cs.SURR_HI:
            self.err("lone surrogate in pattern", pos)
        return ("chars", cs.normalize([(cp, cp)]))

    def parse_group(self):
        start = self.i
        self.i += 1
        if self.peek() == "?":
            nxt = self.peek(1)
            if nxt == ":":
                self.i += 2
            elif nxt in ("=", "!"):
                self.err("lookahead assertions are not supported", start, unsupported=True)
            elif nxt == "<":
                n2 = self.peek(2)
                if n2 in ("=", "!"):
                    self.err("lookbehind assertions are not supported", start, unsupported=True)
                # named group (?<name>...)
                j = self.i + 2
                k = j
                while k < self.n and (self.p[k].isalnum() or self.p[k] in "_$"):
                    k += 1
                if k == j or k >= self.n or self.p[k] != ">":
                    self.err("invalid group name", start)
                self.i = k + 1
            else:
                self.err("inline flags and unknown group modifiers are not supported", start, unsupported=True)
        node = self.parse_alternation()
        if self.peek() != ")":
            self.err("missing ')'", start)
        self.i += 1
        return node

    def parse_class(self) -> tuple:
        start = self.i
        self.i += 1
        negate = False
        if self.peek() == "^":
            negate = True
            self.i += 1
        items = []
        while True:
            c = self.peek()
            if c is None:
                self.err("unterminated character class", start)
            if c == "]":
                self.i += 1
                break
            lo_set, lo_cp = self.class_atom()
            if self.peek() == "-" and self.peek(1) is not None and self.peek(1) != "]":
                dash = self.i
                self.i += 1
                hi_set, hi_cp = self.class_atom()
                if lo_cp is None or hi_cp is None:
                    self.err("character class escape used as a range bound", dash)
                if lo_cp > hi_cp:
                    self.err("range out of order in character class", dash)
                items.append((lo_cp, hi_cp))
            else:
                items.extend(lo_set)
        r = cs.normalize(items)
        return cs.complement(r) if negate else r

    def class_atom(self):
        """Returns (ranges, single code point or None)."""
        c = self.peek()
        pos = self.i
        if c == "\\":
            if self.peek(1) == "b":
                self.i += 2
                return (((8, 8),), 8)
            if self.peek(1) == "-":
                self.i += 2
                return (((45, 45),), 45)
            r = self.parse_escape(in_class=True)
            if len(r) == 1 and r[0][0] == r[0][1] and self._last_escape_single:
                return (r, r[0][0])
            return (r, None)
        self.i += 1
        cp = ord(c)
        if cs.SURR_LO <= cp <= cs.SURR_HI:
            self.err("lone surrogate in pattern", pos)
        return (((cp, cp),), cp)

    _last_escape_single = False

    def parse_escape(self, in_class: bool):
        start = self.i
        self.i += 1
        c = self.peek()
        if c is None:
            self.err("pattern ends with a lone backslash", start)
        self.i += 1
        self._last_escape_single = True
        simple = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11}
        if c in simple:
            return ((simple[c], simple[c]),)
        if c in "dDwWsS":
            self._last_escape_single = False
            base = {"d": cs.DIGIT, "w": cs.WORD, "s": cs.SPACE}[c.lower()]
            return cs.complement(base) if c.isupper() else base
        if c == "0":
            if self.peek() is not None and self.peek().isdigit():
                self.err("octal escapes are not supported", start, unsupported=True)
            return ((0, 0),)
        if c.isdigit():
            self.err("backreferences are not supported", start, unsupported=True)
        if c == "b" or c == "B":
            self.err("word boundary assertions are not supported", start, unsupported=True)
        if c in "pP":
            self.err("Unicode property classes are not supported", start, unsupported=True)
        if c == "k":
            self.err("named backreferences are not supported", start, unsupported=True)
        if c == "x":
            h = self.p[self.i:self.i + 2]
            if len(h) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in h):
                self.i += 2
                v = int(h, 16)
                return ((v, v),)
            self.err("invalid \\x escape", start)
        if c == "u":
            if self.peek() == "{":  # \u{X...}: code point escape (u-mode)
                close = self.p.find("}", self.i)
                h = self.p[self.i + 1:close] if close > 0 else ""
                if h and all(ch in _HEX for ch in h):
                    v = int(h, 16)
                    if v > cs.MAX_CP:
                        self.err("\\u{...} escape beyond U+10FFFF", start)
                    if cs.SURR_LO <= v <= cs.SURR_HI:
                        self.err("lone surrogate escape (not a Unicode scalar value)", start)
                    self.i = close + 1
                    return ((v, v),)
                self.err("invalid \\u{...} escape", start)
            h = self.p[self.i:self.i + 4]
            if len(h) == 4 and all(ch in _HEX for ch in h):
                v = int(h, 16)
                self.i += 4
                if 0xD800 <= v <= 0xDBFF:  # a surrogate pair \uHHHH\uLLLL is one code point
                    lo = self.p[self.i:self.i + 6]
                    if len(lo) == 6 and lo[:2] == "\\u" and all(ch in _HEX for ch in lo[2:]) \
                            and 0xDC00 <= int(lo[2:], 16) <= 0xDFFF:
                        self.i += 6
                        v = 0x10000 + ((v - 0xD800) << 10) + (int(lo[2:], 16) - 0xDC00)
                        return ((v, v),)
                if cs.SURR_LO <= v <= cs.SURR_HI:
                    self.err("lone surrogate escape (not a Unicode scalar value)", start)
                return ((v, v),)
            self.err("invalid \\u escape", start)
        if c == "c":
            l = self.peek()
            if l is not None and l.isascii() and l.isalpha():
                self.i += 1
                v = ord(l) % 32
                return ((v, v),)
            self.err("invalid \\c escape", start)
        if c in _IDENTITY_ESCAPES or (in_class and c == "-"):
            return ((ord(c), ord(c)),)
        if c.isascii() and c.isalnum():
            self.err(f"unknown escape '\\{c}'", start)
        self.err(f"'\\{c}' is not a valid escape with the u flag (only syntax characters "
                 f"^$\\.*+?()[]{{}}|/ may be escaped; write '{c}' without the backslash)", start)


def parse(pattern: str, kind: str = "InvalidRegex", unsupported_kind: str | None = None) -> ParsedRegex:
    """Parse a regex.

    Raises:
        ConstraintError: ``(kind, message, "line:col")`` for malformed syntax;
            ``(unsupported_kind, ...)`` (default: ``kind``) for valid ECMAScript outside the supported
            subset (lookaround, backreferences, word boundaries, Unicode properties, inline flags,
            octal escapes, counts above ``MAX_REPEAT``).
    """
    if not isinstance(pattern, str):
        raise ConstraintError(kind, "pattern must be a string", "")
    for k, ch in enumerate(pattern):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise ConstraintError(kind, "lone surrogate in pattern", _loc(pattern, k))
    p = _Parser(pattern, kind, unsupported_kind)
    alts = p.parse_top()
    if p.i != p.n:
        p.err("unexpected character")
    return ParsedRegex(pattern, alts)
