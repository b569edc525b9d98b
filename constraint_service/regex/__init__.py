"""ECMAScript-subset regular expressions for NInfer (seed 000: regex constraint + JSON Schema `pattern`).

Public API:
  regex_to_ebnf(pattern) -> str           full-match regex -> xgrammar EBNF with a `root` rule
  parse_regex(pattern, kind="InvalidRegex", unsupported_kind=None) -> ParsedRegex
  full_ast(parsed) / search_ast(parsed)   AST of the full-match / search (schema `pattern`) language
  ast_to_expr(node, json_mode)             EBNF expression (json_mode: canonical JSON-string escaping)
  regex_fullmatch(pattern, text) / regex_search(pattern, text)   reference matchers (own NFA)
"""
from __future__ import annotations

from functools import lru_cache

from . import charset
from .automaton import AutomatonLimit, NFA, build_nfa, nfa_matches, product_dfa, prune
from .ebnf import ast_to_expr, charset_json, charset_raw, ebnf_string, json_escape_char
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


def regex_to_ebnf(pattern: str) -> str:
    """Full-match regex -> EBNF text with a `root` rule. Raises ConstraintError("InvalidRegex", msg, "1:col")."""
    parsed = parse_regex(pattern, "InvalidRegex")
    return "root ::= " + ast_to_expr(full_ast(parsed), json_mode=False) + "\n"


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
    "regex_fullmatch", "regex_search", "build_nfa", "product_dfa", "prune", "AutomatonLimit",
    "charset", "charset_json", "charset_raw", "ebnf_string", "json_escape_char",
]
