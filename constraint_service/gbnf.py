"""GBNF validation (seed 000 §GBNF; issue 3 "The five body constraints").

The accepted language is llama.cpp's GBNF (``grammars/README.md`` of
llama.cpp; issue 13) together with xgrammar 0.2.9's EBNF, entry rule ``root``:
literals, character classes, sequences, alternation, the empty alternative
(``ws ::= | " "``, ``( "a" | )``), ``.`` (any one code point),
``* + ? {m} {m,} {m,n}`` repetition, recursion (left recursion included),
token references -- llama.cpp's ``<[N]>`` / ``!<[N]>`` / ``<text>`` /
``!<text>`` and xgrammar's ``Token(id, ...)`` / ``ExcludeToken(id, ...)``
(seed 000 Token / ExcludeToken: one token with that id / one token with none
of those ids) -- and ``(= ...)`` lookahead annotations (upstream meaning: a
hint describing what may follow a rule; the language is defined by the rule
bodies).  llama.cpp spellings are rewritten into xgrammar's before parsing
(:func:`_translate_llama_dialect`); every location still refers to the text
the user sent.  Deliberate differences from llama.cpp: left recursion is
supported (llama.cpp refuses it) and ``{m,n}`` is exact for any ``n`` (llama.cpp
turns ``n > 2000`` into "unbounded" and refuses ``m > 2000``).

Rejected before compiling, each with a location where one exists:

* syntax errors -> ``InvalidGrammar`` with ``line:col`` (1-based, characters);
* no ``root`` rule -> ``InvalidGrammar`` "missing entry rule";
* upstream constructors ``TagDispatch``, ``TokenTagDispatch``, ``Regex``,
  ``Substring`` -> ``InvalidGrammar``;
* rule attributes (``root[temperature=0.5]``, ``max_tokens``, ``max_chars``,
  ``capture``, ``stop_capture``): they change sampling or budgets, which
  NInfer's own contracts own -> ``InvalidGrammar``;
* NUL in a string literal (``"\\x00"``; xgrammar 0.2.9 silently truncates the
  literal there -- write ``[\\x00]`` instead) -> ``InvalidGrammar``;
* token references to ids outside the tokenizer, EOS, special/control ids or
  empty tokens, and ``<text>`` that is not the text of exactly one token ->
  ``InvalidTokenReference``.

xgrammar 0.2.9 lets ``ExcludeToken(...)`` match a *stop* token as if it were
text (``root ::= ExcludeToken(97)`` allows EOS at the start and then reports
terminated with an incomplete sentence).  Every ``ExcludeToken`` call is
therefore rewritten to also exclude the EOS ids before compiling, and the
rewrite is verified on the re-parsed grammar.

After validation, ``R{m,n}`` of a star-closed ``R`` (``L(R) = L(R)*``) is
replaced by ``R`` (:func:`_collapse_closed_repeats`; same language, avoids
exponential matching of nested nullable repetitions), and every ``R{m,n}`` with
a count over 128 is written as counts of at most 128 (:func:`_split_long_repeats`;
same language: xgrammar 0.2.9's masks for longer counted repetitions allow
tokens its matcher rejects).

Detection uses xgrammar's parsed structure (``Grammar.serialize_json``,
format ``v18``); locations come from a small lexer over the source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import xgrammar as xgr

from .backend import XGrammarBackend
from .backend.xgrammar_backend import GrammarEdit
from .errors import ConstraintError
from .regex.ebnf import REPEAT_PIECE, repeat_chain
from .vocab import Vocabulary

__all__ = ["FORBIDDEN_CONSTRUCTORS", "parse_gbnf"]

#: xgrammar 0.2.9 GrammarExpr type codes (serialize_json "grammar_expr_data").
_EXPR_TAG_DISPATCH = 7
_EXPR_TOKEN = 9
_EXPR_EXCLUDE_TOKEN = 10
_EXPR_TOKEN_TAG_DISPATCH = 11
_EXPR_REGEX = 12
_EXPR_SUBSTRING = 13
_SERIAL_VERSION = "v18"

FORBIDDEN_CONSTRUCTORS = {
    _EXPR_TAG_DISPATCH: "TagDispatch",
    _EXPR_TOKEN_TAG_DISPATCH: "TokenTagDispatch",
    _EXPR_REGEX: "Regex",
    _EXPR_SUBSTRING: "Substring",
}

_IDENT_START = re.compile(r"[A-Za-z_]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*")
_NUL_ESCAPE = re.compile(r"\\(x0{2}|u0{4}|U0{8})")
_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")
_CP_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8}))")
_EXPR_BYTE_STRING, _EXPR_CHAR_CLASS, _EXPR_CHAR_CLASS_STAR, _EXPR_EMPTY = 0, 1, 2, 3
_EXPR_RULE_REF, _EXPR_SEQUENCE, _EXPR_CHOICES, _EXPR_REPEAT = 4, 5, 6, 8


@dataclass
class _Call:
    name: str
    line: int
    col: int
    args: list  # [(int_value, line, col)]
    close: int = -1  # index of the closing ")" in the source (Token/ExcludeToken)


@dataclass
class _Scan:
    calls: list
    nul_literals: list  # [(line, col)]
    raw_nul: list
    bad_code_points: list  # [(line, col, code point)]: escapes to surrogates or > U+10FFFF


def _scan(source: str) -> _Scan:
    """Lex ``source`` enough to locate macro calls and NUL literals."""
    calls, nuls, raw_nul, bad_cp = [], [], [], []
    i, n, line, col = 0, len(source), 1, 1

    def adv(k: int) -> None:
        nonlocal i, line, col
        for _ in range(k):
            if i < n and source[i] == "\n":
                line, col = line + 1, 1
            else:
                col += 1
            i += 1

    while i < n:
        c = source[i]
        if c == "\x00":
            raw_nul.append((line, col))
            adv(1)
        elif c == "#":
            while i < n and source[i] != "\n":
                adv(1)
        elif c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            start = (line, col)
            adv(1)
            while i < n and source[i] != close and source[i] != "\n":
                if source[i] == "\\":
                    if c == '"' and _NUL_ESCAPE.match(source, i):
                        nuls.append(start)
                    m = _CP_ESCAPE.match(source, i)
                    if m:
                        cp = int(m.group(1) or m.group(2), 16)
                        if 0xD800 <= cp <= 0xDFFF or cp > 0x10FFFF:
                            bad_cp.append((line, col, cp))
                    adv(2)
                else:
                    adv(1)
            adv(1)
        elif _IDENT_START.match(c):
            m = _IDENT.match(source, i)
            name, sline, scol = m.group(0), line, col
            adv(len(name))
            j = i
            while j < n and source[j] in " \t":
                j += 1
            if j < n and source[j] == "(":
                call = _Call(name, sline, scol, [])
                calls.append(call)
                if name in ("Token", "ExcludeToken"):
                    adv(j - i + 1)
                    while i < n and source[i] != ")":
                        if source[i].isdigit():
                            d = re.match(r"\d+", source[i:]).group(0)
                            call.args.append((int(d), line, col))
                            adv(len(d))
                        else:
                            adv(1)
                    call.close = i
        else:
            adv(1)
    return _Scan(calls, nuls, raw_nul, bad_cp)


def _check_token_id(tid: int, vocab: Vocabulary) -> str:
    """Return "" if ``tid`` is a usable visible terminal, else the reason."""
    n = len(vocab.token_bytes)
    if not 0 <= tid < n:
        return f"token id {tid} is outside the tokenizer's ids [0, {n})"
    if tid in vocab.eos_ids:
        return f"token id {tid} is EOS; EOS is owned by the completion rule, not a visible terminal"
    if tid in vocab.special_ids:
        return f"token id {tid} is a special/control token, not ordinary text"
    if not vocab.token_bytes[tid]:
        return f"token id {tid} has no bytes"
    return ""


def parse_gbnf(source: str, vocab: Vocabulary) -> "xgr.Grammar":
    """Validate GBNF text against the contract and the vocabulary; return the parsed grammar.

    Args:
        source: GBNF/EBNF text with entry rule ``root``, in llama.cpp's dialect or
            xgrammar's (see module doc).
        vocab: the model vocabulary (for token reference checks).

    Returns:
        The xgrammar ``Grammar`` (not yet compiled).

    Raises:
        ConstraintError: ``InvalidGrammar`` or ``InvalidTokenReference`` (see module
            doc), located ``line:col`` in ``source``.
    """
    tr = _translate_llama_dialect(source, vocab)
    try:
        return _parse_xgrammar_dialect(tr.text, vocab)
    except ConstraintError as exc:
        loc = tr.location(exc.location)
        message = exc.message
        spelled = _llama_reference_at(source, loc)
        if spelled and exc.kind == "InvalidTokenReference":  # name it as the user wrote it
            message = re.sub(r"^(Token|ExcludeToken): ", f"{spelled}: ", message)
        raise ConstraintError(exc.kind, message, loc) from None


def _llama_reference_at(source: str, loc: str) -> str:
    """The llama.cpp token reference (``<[5]>``, ``!<eos>``) whose text holds ``loc``, else ""."""
    m = re.fullmatch(r"(\d+):(\d+)", loc or "")
    if not m:
        return ""
    lines = source.split("\n")
    line_no, col = int(m.group(1)), int(m.group(2))
    if line_no > len(lines):
        return ""
    for r in re.finditer(r"!?<(?:\[[0-9]+\]|[^>\n]+)>", lines[line_no - 1]):
        if r.start() < col <= r.end():
            return r.group(0)
    return ""


def _parse_xgrammar_dialect(source: str, vocab: Vocabulary) -> "xgr.Grammar":
    """:func:`parse_gbnf` on text already in xgrammar's spelling (locations in that text)."""
    scan = _scan(source)
    nul = source.find("\x00")
    if nul >= 0:
        line = source.count("\n", 0, nul) + 1
        col = nul - (source.rfind("\n", 0, nul) + 1) + 1
        raise ConstraintError("InvalidGrammar", "NUL character in grammar text", f"{line}:{col}")
    m = _SURROGATE_CHAR.search(source)
    if m:
        k = m.start()
        line = source.count("\n", 0, k) + 1
        col = k - (source.rfind("\n", 0, k) + 1) + 1
        raise ConstraintError("InvalidGrammar", "lone surrogate character in grammar text", f"{line}:{col}")
    if scan.bad_code_points:
        line, col, cp = scan.bad_code_points[0]
        what = "a surrogate" if cp <= 0xFFFF else "beyond U+10FFFF"
        raise ConstraintError(
            "InvalidGrammar",
            f"escape to U+{cp:04X} is not a Unicode scalar value ({what}); outputs must be valid UTF-8",
            f"{line}:{col}",
        )
    grammar = XGrammarBackend.parse_ebnf(source, kind="InvalidGrammar")
    data = json.loads(grammar.serialize_json())
    if data.get("__VERSION__") != _SERIAL_VERSION:  # pragma: no cover - pinned xgrammar
        raise RuntimeError(f"unexpected xgrammar grammar serialisation {data.get('__VERSION__')!r}")

    # Rule attributes: [name, body, lookahead, exact_lookahead, max_tokens, max_chars,
    #                   capture_name, <flag>, temperature]
    for rule in data["rules"]:
        name = rule[0]
        if rule[4] != -1 or rule[5] != -1 or rule[6] or rule[7] or rule[8] is not None:
            m = re.search(r"^[ \t]*(" + re.escape(name) + r")[ \t]*\[", source, re.M)
            loc = ""
            if m:
                line = source.count("\n", 0, m.start(1)) + 1
                col = m.start(1) - (source.rfind("\n", 0, m.start(1)) + 1) + 1
                loc = f"{line}:{col}"
            raise ConstraintError(
                "InvalidGrammar",
                f'rule attributes are not supported (rule "{name}"); sampling and budgets '
                "are set by request options",
                loc,
            )
    if data.get("suffix_stop_infos"):
        raise ConstraintError("InvalidGrammar", "rule attributes are not supported (stop_capture)", "")

    exprs_data, indptr = data["grammar_expr_data"], data["grammar_expr_indptr"]
    bounds = list(indptr) + [len(exprs_data)]
    token_ids: list[int] = []
    for k in range(len(indptr)):
        expr = exprs_data[bounds[k]: bounds[k + 1]]
        if not expr:
            continue
        etype = expr[0]
        if etype in FORBIDDEN_CONSTRUCTORS:
            cname = FORBIDDEN_CONSTRUCTORS[etype]
            site = next((c for c in scan.calls if c.name == cname), None)
            raise ConstraintError(
                "InvalidGrammar",
                f"{cname}(...) is not available in NInfer grammars "
                "(supported: literals, classes, sequences, alternation, repetition, recursion, "
                "Token, ExcludeToken, (= ...) lookahead)",
                f"{site.line}:{site.col}" if site else "",
            )
        if etype in (_EXPR_TOKEN, _EXPR_EXCLUDE_TOKEN):
            token_ids.extend(expr[2: 2 + expr[1]])

    for call in scan.calls:  # source order, with locations
        if call.name in ("Token", "ExcludeToken"):
            for tid, line, col in call.args:
                why = _check_token_id(tid, vocab)
                if why:
                    raise ConstraintError("InvalidTokenReference", f"{call.name}: {why}", f"{line}:{col}")
    for tid in token_ids:  # belt and braces: whatever the lexer missed
        why = _check_token_id(tid, vocab)
        if why:
            raise ConstraintError("InvalidTokenReference", why, "")

    if not _root_productive(data):
        m = re.search(r"^[ \t]*(root)[ \t]*::=", source, re.M)
        loc = ""
        if m:
            line = source.count("\n", 0, m.start(1)) + 1
            col = m.start(1) - (source.rfind("\n", 0, m.start(1)) + 1) + 1
            loc = f"{line}:{col}"
        raise ConstraintError(
            "InvalidGrammar",
            "rule root derives no finite string (every alternative recurses forever); "
            "the language is empty",
            loc,
        )

    if any(c.name == "ExcludeToken" for c in scan.calls) and vocab.eos_ids:
        grammar = _exclude_eos(source, scan, vocab)

    if scan.nul_literals:
        line, col = scan.nul_literals[0]
        raise ConstraintError(
            "InvalidGrammar",
            'NUL (\\x00) inside a string literal is not supported; use the class [\\x00]',
            f"{line}:{col}",
        )
    return _split_long_repeats(_collapse_closed_repeats(grammar))


def _split_long_repeats(grammar: "xgr.Grammar") -> "xgr.Grammar":
    """Rewrite every ``R{m,n}`` with ``m`` or ``n`` over ``REPEAT_PIECE`` (128) as counts of at most 128:
    ``R{128,128}`` q times, then a chain of rules ``C_k ::= R{l,127} | R{128,128} C_k+1`` ending in
    ``R{l,h}`` (``regex.ebnf.repeat_chain``: the same lengths, one parse each, so the same language).

    xgrammar 0.2.9's token masks for a counted repetition over 128 allow tokens its matcher then rejects
    (``root ::= [a-z\u4e00-\u9fff]{0,600}``: ``"k\n"``, ``"status="`` on the first mask; see
    ``regex.ebnf.REPEAT_PIECE``): an integrity error for the request. The chain's masks are sound in the same
    checks. The repetition's expression becomes a reference to a new rule (named after the repeated rule), so
    whatever held it is unchanged. Returns ``grammar`` itself when nothing applies.
    """
    g = GrammarEdit(grammar)
    out = g.exprs
    long = [k for k, e in enumerate(out)
            if e and e[0] == _EXPR_REPEAT and (e[3] > REPEAT_PIECE or e[4] > REPEAT_PIECE)]  # e[4] -1: unbounded
    if not long:
        return grammar

    def rep(sub: int, a: int, b: int | None) -> int:
        return g.add([_EXPR_REPEAT, 3, sub, a, -1 if b is None else b])

    for k in long:
        _, _, sub, lo, hi = out[k]
        base = g.rules[sub][0]
        q, levels = repeat_chain(lo, None if hi == -1 else hi)
        nxt = None  # rule id of the level after this one (None: the last level)
        for j in range(len(levels) - 1, -1, -1):
            a, b = levels[j]
            if nxt is None:
                alts = [g.add([_EXPR_EMPTY, 0]) if (a, b) == (0, 0) else g.add([_EXPR_SEQUENCE, 1, rep(sub, a, b)])]
            else:
                then = g.add([_EXPR_RULE_REF, 1, nxt])
                alts = [g.add([_EXPR_SEQUENCE, 1, rep(sub, a, b)]),
                        g.add([_EXPR_SEQUENCE, 2, rep(sub, REPEAT_PIECE, REPEAT_PIECE), then])]
            nxt = g.new_rule(f"{base}_chain{j}", g.add([_EXPR_CHOICES, len(alts), *alts]))
        seq = [rep(sub, REPEAT_PIECE, REPEAT_PIECE) for _ in range(q)] + [g.add([_EXPR_RULE_REF, 1, nxt])]
        body = g.add([_EXPR_CHOICES, 1, g.add([_EXPR_SEQUENCE, len(seq), *seq])])
        out[k] = [_EXPR_RULE_REF, 1, g.new_rule(f"{base}_pieces", body)]
    return g.grammar()


def _collapse_closed_repeats(grammar: "xgr.Grammar") -> "xgr.Grammar":
    """Replace ``R{m,n}`` (``n >= 1`` or unbounded) by ``R`` where ``R``'s language is star-closed.

    A language ``L`` with ``L = L*`` (for example ``[^x]*``, or ``(X*){0,9}``)
    satisfies ``L{m,n} = L`` for ``n >= 1``: the rewrite keeps the language
    exactly.  It matters for performance only: xgrammar 0.2.9 expands
    ``{m,n}`` into ``n`` nullable copies, and nested copies make every
    character cost exponentially many parse states (llama.cpp's
    ``(((([^x]*){0,99}){0,99})...)`` grammar, which llama.cpp itself refuses).
    Rules carrying a lookahead annotation are left alone.  Returns ``grammar``
    itself when nothing applies.
    """
    g = GrammarEdit(grammar)
    exprs, rules = g.exprs, g.rules
    repeats = [k for k, e in enumerate(exprs) if e and e[0] == _EXPR_REPEAT]
    if not repeats:
        return grammar
    closed: dict[int, bool] = {}

    def expr_closed(k: int, visiting: frozenset) -> bool:
        e = exprs[k]
        if not e:
            return False
        t = e[0]
        if t == _EXPR_CHAR_CLASS_STAR:
            return True
        if t == _EXPR_RULE_REF:
            return rule_closed(e[2], visiting)
        if t == _EXPR_REPEAT:
            lo, hi = e[3], e[4]
            return (lo == 0 and hi == -1) or (hi != 0 and rule_closed(e[2], visiting))
        if t in (_EXPR_SEQUENCE, _EXPR_CHOICES) and e[1] == 1:
            return expr_closed(e[2], visiting)
        return False

    def rule_closed(r: int, visiting: frozenset) -> bool:
        if r in closed:
            return closed[r]
        if r in visiting or not 0 <= r < len(rules):
            return False
        rule = rules[r]
        ok = rule[2] == -1 and not rule[3] and expr_closed(rule[1], visiting | {r})
        closed[r] = ok
        return ok

    # every closedness is decided on the grammar as parsed, then the repetitions are replaced
    replace = {k: [_EXPR_RULE_REF, 1, exprs[k][2]] for k in repeats
               if exprs[k][4] != 0 and rule_closed(exprs[k][2], frozenset())}
    if not replace:
        return grammar
    for k, e in replace.items():
        exprs[k] = e
    return g.grammar()


def _exclude_eos(source: str, scan: _Scan, vocab: Vocabulary) -> "xgr.Grammar":
    """Re-parse ``source`` with the EOS ids appended to every ``ExcludeToken`` call."""
    extra = "".join(f", {i}" for i in vocab.eos_ids)
    out, last = [], 0
    for call in scan.calls:
        if call.name == "ExcludeToken" and call.close >= 0:
            out.append(source[last: call.close])
            out.append(extra)
            last = call.close
    out.append(source[last:])
    grammar = XGrammarBackend.parse_ebnf("".join(out), kind="InvalidGrammar")
    data = json.loads(grammar.serialize_json())
    exprs_data, indptr = data["grammar_expr_data"], data["grammar_expr_indptr"]
    bounds = list(indptr) + [len(exprs_data)]
    eos = set(vocab.eos_ids)
    for k in range(len(indptr)):
        expr = exprs_data[bounds[k]: bounds[k + 1]]
        if expr and expr[0] == _EXPR_EXCLUDE_TOKEN and not eos <= set(expr[2: 2 + expr[1]]):
            raise ConstraintError("InvalidGrammar", "ExcludeToken(...) form not understood", "")
    return grammar


def _root_productive(data: dict) -> bool:
    """Whether the root rule derives at least one finite string (productivity analysis).

    Over xgrammar's serialised grammar: literals, classes, ``""``, tokens are
    productive; a sequence iff all its elements are; a choice iff one
    alternative is; a rule reference iff the rule is; ``{m,n}`` iff ``m == 0``
    or its rule is (``*``/``?`` are lowered to classes-star / empty
    alternatives, ``+`` to a recursive rule with a base case).  A worklist
    fixpoint: rules are re-evaluated only when a rule they reference becomes
    productive, so the cost stays near-linear in the grammar size.
    """
    exprs_data, indptr = data["grammar_expr_data"], data["grammar_expr_indptr"]
    bounds = list(indptr) + [len(exprs_data)]
    rules = data["rules"]
    nrules = len(rules)
    productive = [False] * nrules

    def expr_of(k: int) -> list:
        return exprs_data[bounds[k]: bounds[k + 1]]

    def refs_of(k: int, out: set, seen: set) -> None:
        stack = [k]
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            x = expr_of(e)
            if not x:
                continue
            t = x[0]
            if t == _EXPR_RULE_REF:
                out.add(x[2])
            elif t == _EXPR_REPEAT:
                out.add(x[2])
            elif t in (_EXPR_SEQUENCE, _EXPR_CHOICES):
                stack.extend(x[2: 2 + x[1]])

    def prod(k: int) -> bool:
        # iterative post-order evaluation (no recursion limit on deep bodies)
        memo: dict[int, bool] = {}
        stack = [(k, False)]
        while stack:
            e, expanded = stack.pop()
            if e in memo:
                continue
            x = expr_of(e)
            t = x[0] if x else _EXPR_EMPTY
            if t in (_EXPR_SEQUENCE, _EXPR_CHOICES):
                kids = x[2: 2 + x[1]]
                if not expanded:
                    stack.append((e, True))
                    stack.extend((c, False) for c in kids if c not in memo)
                    continue
                vals = [memo[c] for c in kids]
                memo[e] = all(vals) if t == _EXPR_SEQUENCE else any(vals)
            elif t == _EXPR_RULE_REF:
                memo[e] = productive[x[2]]
            elif t == _EXPR_REPEAT:
                memo[e] = x[3] == 0 or productive[x[2]]
            else:  # byte string, classes, empty, tokens (forbidden constructors rejected earlier)
                memo[e] = True
        return memo[k]

    users: list[list[int]] = [[] for _ in range(nrules)]
    for r, rule in enumerate(rules):
        deps: set = set()
        refs_of(rule[1], deps, set())
        for d in deps:
            if 0 <= d < nrules:
                users[d].append(r)
    work = list(range(nrules))
    queued = [True] * nrules
    while work:
        r = work.pop()
        queued[r] = False
        if productive[r]:
            continue
        if prod(rules[r][1]):
            productive[r] = True
            for u in users[r]:
                if not productive[u] and not queued[u]:
                    queued[u] = True
                    work.append(u)
    return productive[data["root_rule_id"]]


# --------------------------------------------------------------------------
# llama.cpp's GBNF dialect (issue 13 "Grammar, regex and number faults")
# --------------------------------------------------------------------------

_WS_CHARS = " \t\r\n"
_IDENT_CHAR = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_RULE_DEF = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_\-.]*)[ \t]*(?:\[[^\]\n]*\])?[ \t]*::=", re.M)
_TOKEN_ID = re.compile(r"<\[([0-9]+)\]>")
#: what llama.cpp allows after a backslash in a string literal that xgrammar 0.2.9 does not
_STRING_ONLY_ESCAPES = {"[": "[", "]": "]", "-": "-"}
_ANY_CHAR = "[^]"  # xgrammar: the complement of the empty class = any code point


@dataclass
class _Translation:
    """Source text rewritten into xgrammar's spelling, with the origin of every character."""

    text: str
    origin: list  # origin[k]: index in the user's source of text[k]; one extra entry for end of text
    source: str

    def location(self, loc: str) -> str:
        """Map ``"line:col"`` in :attr:`text` back to ``"line:col"`` in the user's source."""
        m = re.fullmatch(r"(\d+):(\d+)", loc or "")
        if not m:
            return loc
        line, col = int(m.group(1)), int(m.group(2))
        k, cur = 0, 1
        while cur < line:
            nl = self.text.find("\n", k)
            if nl < 0:
                return loc
            k, cur = nl + 1, cur + 1
        k = min(k + col - 1, len(self.text))
        return _line_col(self.source, self.origin[k])


def _line_col(text: str, k: int) -> str:
    line = text.count("\n", 0, k) + 1
    return f"{line}:{k - (text.rfind(chr(10), 0, k) + 1) + 1}"


def _skip_space(src: str, i: int) -> int:
    """llama.cpp's ``parse_space(newline_ok=true)``: blanks, newlines and ``#`` comments."""
    n = len(src)
    while i < n:
        if src[i] in _WS_CHARS:
            i += 1
        elif src[i] == "#":
            while i < n and src[i] not in "\r\n":
                i += 1
        else:
            break
    return i


def _literal_end(src: str, i: int, close: str) -> int:
    """Index of the closing quote/bracket of the literal opening at ``i`` (llama.cpp: may span
    lines), or -1 when unterminated."""
    j, n = i + 1, len(src)
    if close == "]" and j < n and src[j] == "^":
        j += 1
    while j < n:
        c = src[j]
        if c == "\\":
            j += 2
            continue
        if c == close:
            return j
        j += 1
    return -1


def _token_by_text(text: str, by_bytes: dict, loc: str) -> int:
    """The id of the one token whose bytes are exactly ``text`` (llama.cpp's ``<text>``).

    ``by_bytes`` maps token bytes to ids (built once per grammar); its ``None``
    entry holds the vocabulary."""
    vocab = by_bytes[None]
    ids = by_bytes.get(text.encode("utf-8"), [])
    if not ids:
        raise ConstraintError(
            "InvalidTokenReference",
            f"{text!r} is not the text of a single token of this tokenizer "
            "(llama.cpp's <...> names one token by its text; use <[id]> or a string literal)",
            loc,
        )
    marked = [i for i in ids if i in vocab.eos_ids or i in vocab.special_ids]
    if marked:  # what llama.cpp's tokenizer (parse_special=true) resolves to; refused below
        return marked[0]
    if len(ids) > 1:
        raise ConstraintError("InvalidTokenReference",
                              f"{text!r} is the text of several tokens {ids}; use <[id]>", loc)
    return ids[0]


def _translate_llama_dialect(src: str, vocab: Vocabulary) -> _Translation:
    """Rewrite llama.cpp-only GBNF spellings into xgrammar 0.2.9 EBNF, keeping everything else.

    * an empty alternative (``ws ::= | " "``, ``( "a" | )``, ``x ::= "a" |`` at the
      end, ``()``) -> ``""``;
    * ``.`` outside literals and rule names -> ``[^]`` (any code point);
    * ``<[N]>`` -> ``Token(N)``, ``!<[N]>`` -> ``ExcludeToken(N)``, ``<text>`` /
      ``!<text>`` -> the same with the id of the single token spelled ``text``;
    * in string literals, the escapes ``\\[`` ``\\]`` ``\\-`` and raw line breaks
      (llama.cpp accepts them; xgrammar does not).

    Text that is not well formed is copied unchanged so that the parser reports
    it at its place.

    Raises:
        ConstraintError: ``InvalidTokenReference`` for a ``<text>`` that names no
            single token; ``InvalidGrammar`` for a malformed ``<...>``.
    """
    rules = {m.group(1) for m in _RULE_DEF.finditer(src)}
    by_bytes: dict = {}  # token bytes -> ids, built on the first <text> reference
    out: list[str] = []
    origin: list[int] = []
    n = len(src)

    def emit(text: str, at: int, one_to_one: bool = False) -> None:
        out.append(text)
        origin.extend(range(at, at + len(text)) if one_to_one else [at] * len(text))

    def last_char() -> str:
        for piece in reversed(out):
            if piece:
                return piece[-1]
        return ""

    def emit_atom(text: str, at: int) -> None:
        if last_char() in _IDENT_CHAR or last_char() == ".":
            emit(" ", at)  # keep "x.", "x<[5]>" two elements in xgrammar's lexer
        emit(text, at)

    def empty_after(i: int, closers: str) -> bool:
        j = _skip_space(src, i)
        return j >= n or src[j] in closers

    i = 0
    while i < n:
        c = src[i]
        if c == "#":
            j = i
            while j < n and src[j] not in "\r\n":
                j += 1
            emit(src[i:j], i, True)
            i = j
        elif c in "\"[":
            close = '"' if c == '"' else "]"
            end = _literal_end(src, i, close)
            if end < 0:  # unterminated: let the parser report it
                j = i + 1
                while j < n and src[j] not in "\r\n":
                    j += 1
                emit(src[i:j], i, True)
                i = j
                continue
            emit(c, i)
            j = i + 1
            while j < end:
                ch = src[j]
                if ch == "\\" and j + 1 < end:
                    nxt = src[j + 1]
                    if c == '"' and nxt in _STRING_ONLY_ESCAPES:
                        emit(_STRING_ONLY_ESCAPES[nxt], j)
                    else:
                        emit(src[j:j + 2], j, True)
                    j += 2
                elif ch == "\n":
                    emit("\\n", j)
                    j += 1
                elif ch == "\r":
                    emit("\\r", j)
                    j += 1
                else:
                    emit(ch, j)
                    j += 1
            emit(close, end)
            i = end + 1
        elif src.startswith("::=", i):
            emit("::=", i, True)
            i += 3
            if empty_after(i, "|"):
                emit(' ""', i)
        elif c == "(":
            emit("(", i)
            i += 1
            if i < n and src[i] == "=":  # xgrammar lookahead "(= ...)"
                continue
            if empty_after(i, "|)"):
                emit('""', i)
        elif c == "|":
            emit("|", i)
            i += 1
            if empty_after(i, "|)"):
                emit(' ""', i)
        elif c == ".":
            emit_atom(_ANY_CHAR, i)
            i += 1
        elif c == "<" or (c == "!" and src.startswith("<", i + 1)):
            neg = c == "!"
            lt = i + 1 if neg else i
            name = "ExcludeToken(" if neg else "Token("
            m = _TOKEN_ID.match(src, lt)
            if m:
                emit_atom(name, i)
                emit(m.group(1), m.start(1), True)
                emit(")", m.end(1))
                i = m.end()
                continue
            gt = src.find(">", lt + 1)
            nl = src.find("\n", lt)
            if gt < 0 or (0 <= nl < gt) or gt == lt + 1 or src.startswith("[", lt + 1):
                raise ConstraintError(
                    "InvalidGrammar",
                    "malformed token reference: expected <[id]> (decimal id) or <text> on one line",
                    _line_col(src, lt),
                )
            if not by_bytes:
                by_bytes[None] = vocab
                for k, b in enumerate(vocab.token_bytes):
                    by_bytes.setdefault(b, []).append(k)
            tid = _token_by_text(src[lt:gt + 1], by_bytes, _line_col(src, lt))
            emit_atom(name, i)
            emit(str(tid), lt)
            emit(")", gt)
            i = gt + 1
        elif c.isascii() and (c.isalpha() or c == "_"):
            m = _IDENT.match(src, i)
            word = m.group(0)
            if "." in word and word not in rules:
                word = word[: word.index(".")]  # llama.cpp: "x." is x then any character
            emit(word, i, True)
            i += len(word)
        else:
            emit(c, i)
            i += 1
    origin.append(n)
    return _Translation("".join(out), origin, src)
