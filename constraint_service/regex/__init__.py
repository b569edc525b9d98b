"""ECMAScript-subset regular expressions for NInfer (seed 000: regex constraint + JSON Schema `pattern`).

Public API:
  regex_to_ebnf(pattern) -> str           full-match regex -> xgrammar EBNF with a `root` rule (its minimal DFA)
  parse_regex(pattern, kind="InvalidRegex", unsupported_kind=None) -> ParsedRegex
  full_ast(parsed) / search_ast(parsed)   AST of the full-match / search (schema `pattern`) language
  ast_to_expr(node, json_mode)             EBNF expression (json_mode: canonical JSON-string escaping)
  regex_fullmatch(pattern, text) / regex_search(pattern, text)   reference matchers (own NFA)
"""
from __future__ import annotations

from functools import lru_cache

from . import charset
from .automaton import AutomatonLimit, NFA, build_nfa, minimize, nfa_matches, product_dfa, prune
from .ebnf import ast_to_expr, charset_json, charset_raw, class_text, dfa_rule_bodies, ebnf_string, json_escape_char
from .parser import ParsedRegex, parse as parse_regex

ANY_STAR = ("rep", ("chars", charset.ANY), 0, None)


def full_ast(parsed: ParsedRegex):
    alts = [node for _, _, node in parsed.alternatives]
    return alts[0] if len(alts) == 1 else ("alt", alts)


def search_ast(parsed: ParsedRegex):
    alts = []
    for a_start, a_end, node in parsed.alternatives:
        items = []
        if not a_start:
            items.append(ANY_STAR)
        items.append(node)
        if not a_end:
            items.append(ANY_STAR)
        alts.append(("cat", items))
    return alts[0] if len(alts) == 1 else ("alt", alts)


#: The regex constraint is written as its minimal DFA when that has at most this many states (one rule
#: each), else as the regex's own structure.
REGEX_DFA_STATES = 512
#: The DFA is only attempted for a Thompson NFA of at most this many states: each DFA state explored is a set
#: of NFA states, so a small source such as ``(a?){20000}`` (40,000 NFA states, each DFA state a closure of up
#: to 20,000) took 8.4 s to reach the state limit on the 2-core box; ``(a?){2000}`` (4,002) takes 0.37 s.
REGEX_NFA_STATES = 4_096
#: ... and its rules are kept only up to this many characters of grammar text: the rules repeat a state's
#: character classes, so a class of many ranges under a counted repetition (82 characters of source) wrote
#: 52 KB, 2 KB of source 3 MB (and a 1 GB compile); the structural form writes each class once.
REGEX_DFA_TEXT = 256 * 1024
#: The lookahead of every DFA rule: nothing may follow the language (a regex body ends the output; a
#: reasoning prefix only comes before it, ``tools/wrap.py``).
NOTHING_FOLLOWS = "(= [])"


def _star_closed(node) -> bool:
    """Whether ``node``'s language L has L = L* (a sufficient syntactic check: a star, or a counted repetition of
    a star-closed language)."""
    if node[0] == "rep":
        _, sub, lo, hi = node
        return (lo == 0 and hi is None) or ((hi is None or hi >= 1) and _star_closed(sub))
    if node[0] == "cat" and len(node[1]) == 1:
        return _star_closed(node[1][0])
    return False


def collapse_closed_repeats(node):
    """``node`` with every ``R{m,n}`` (``n >= 1`` or unbounded) of a star-closed ``R`` replaced by ``R``: the same
    language (``L{m,n} = L`` when ``L = L*``), as ``gbnf._collapse_closed_repeats`` does for GBNF; applied to the regex
    constraint and to a JSON Schema ``pattern`` (``json_schema/emit.py``). ``(a*){3000}``
    is a one-state DFA, but its Thompson NFA (~9,000 states) is past :data:`REGEX_NFA_STATES`, and its structural
    form matched 9 characters in 21 s (every split of the input over 3,000 nullable copies)."""
    kind = node[0]
    if kind == "rep":
        _, sub, lo, hi = node
        sub = collapse_closed_repeats(sub)
        if _star_closed(sub) and (hi is None or hi >= 1):
            return sub
        return ("rep", sub, lo, hi)
    if kind in ("cat", "alt"):
        return (kind, [collapse_closed_repeats(c) for c in node[1]])
    return node


def regex_to_ebnf(pattern: str) -> str:
    r"""Full-match regex -> xgrammar EBNF text with a ``root`` rule: the same language as
    :func:`regex_fullmatch`, which nothing may follow.

    The grammar is the regex's minimal DFA as right-linear rules, ``root`` being the start state, when the
    DFA has at most :data:`REGEX_DFA_STATES` states (tried for an NFA of at most :data:`REGEX_NFA_STATES`
    states) and its rules at most :data:`REGEX_DFA_TEXT` characters; else the regex's structure
    (``ast_to_expr``). With
    xgrammar 0.2.9 and the SmolLM2 vocabulary the DFA form's masks are precompiled almost whole (H200 host,
    ``bench/results/regex_bench_h200host.json``): ``[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\.`` 21.4 -> 2.3 us
    per mask (compile 47 -> 15 ms), ``[^\n]{0,300}`` 10.4 ms -> 6.2 us (compile 3.0 -> 5.6 s); over 80 regexes
    the structural form's masks took 2.76x as long (geometric mean). The structural form of ``[^\n]{0,300}``,
    ``[\u0000-\u0009\u000b-\ud7ff\ue000-\U0010ffff]{0,300}``, also got xgrammar 0.2.9 masks that allow tokens its
    matcher then rejects (``" \n"``, ``"\r\n"``; see ``ebnf.REPEAT_PIECE``); the DFA form has no counted repetition.

    Raises:
        ConstraintError: ``InvalidRegex`` with ``1:col``, as :func:`parse_regex`.
    """
    ast = collapse_closed_repeats(full_ast(parse_regex(pattern, "InvalidRegex")))
    try:
        dfa = minimize(product_dfa([build_nfa(ast, REGEX_NFA_STATES)], 0, None, REGEX_DFA_STATES))
    except AutomatonLimit:
        dfa = None
    if dfa is not None:
        rules = dfa_rule_bodies(dfa, lambda st: "root" if st == 0 else f"rx_{st}",
                                lambda ranges: (class_text(ranges),), '""', NOTHING_FOLLOWS)
        text = "".join(f"{name} ::= {body}\n" for name, body in rules)
        if len(text) <= REGEX_DFA_TEXT:
            return text
    return "root ::= " + ast_to_expr(ast, json_mode=False) + "\n"


@lru_cache(maxsize=1024)
def _nfa(pattern: str, search: bool) -> NFA:
    parsed = parse_regex(pattern, "InvalidRegex")
    return build_nfa(search_ast(parsed) if search else full_ast(parsed))


def regex_fullmatch(pattern: str, text: str) -> bool:
    return nfa_matches(_nfa(pattern, False), text)


def regex_search(pattern: str, text: str) -> bool:
    return nfa_matches(_nfa(pattern, True), text)


__all__ = [
    "regex_to_ebnf", "parse_regex", "ParsedRegex", "full_ast", "search_ast", "ast_to_expr",
    "regex_fullmatch", "regex_search", "build_nfa", "product_dfa", "prune", "minimize", "AutomatonLimit",
    "charset", "charset_json", "charset_raw", "ebnf_string", "json_escape_char",
]
