"""Boolean combinations of patterns as string languages, and objects with patternProperties or
property-count bounds (issue 13).

`lang_dfa` builds one DFA over code points for: match every positive pattern, match no negative
pattern, be none of the excluded names, and have a length in [min_len, max_len]; `not` on strings and
the key classes of patternProperties (a key matching patterns S and not the others) are such languages.
`object_general` emits an object whose undeclared members are split into these key classes, and counts
members for minProperties / maxProperties. Both are called by emit.Emitter (string / object) only for
nodes that use these features; every other node keeps the emitter's own fast paths.
"""
from __future__ import annotations

from ..errors import ConstraintError
from ..regex import AutomatonLimit, build_nfa, charset as cs, dfa_to_rules, parse_regex, search_ast
from ..regex.automaton import DFA, eps_closure, nfa_charsets, prune, step
from ..regex.ebnf import repeat
from .ir import NEVER, Object, String

MAX_STATES = 65_536
MAX_KEY_STATES = 4_096  # one key class of patternProperties (built in pure Python: keep it quick)
MAX_LEN_BOUND = 8_192


def _nfa(p: str):
    return build_nfa(search_ast(parse_regex(p, "UnsupportedSchema")))


def lang_dfa(pos: tuple, neg: tuple, excluded=(), min_len: int = 0, max_len: int | None = None,
             max_states: int = MAX_STATES) -> DFA:
    """DFA (code points, start state 0) of the strings matching every pattern in `pos` (search
    semantics), none in `neg`, not equal to any of `excluded`, with min_len <= length <= max_len.
    Raises AutomatonLimit past max_states states or a length bound over MAX_LEN_BOUND."""
    for b in (min_len, max_len):
        if b is not None and b > MAX_LEN_BOUND:
            raise AutomatonLimit("string_length_bound", f"string automaton length bound {b} exceeds {MAX_LEN_BOUND}")
    pn = [_nfa(p) for p in pos]
    nn = [_nfa(p) for p in neg]
    trie = [{}]
    ends = set()
    for name in excluded:
        cur = 0
        for ch in name:
            c = ord(ch)
            if c not in trie[cur]:
                trie.append({})
                trie[cur][c] = len(trie) - 1
            cur = trie[cur][c]
        ends.add(cur)
    sets = set()
    for n in pn + nn:
        sets |= nfa_charsets(n)
    for kids in trie:
        for c in kids:
            sets.add(((c, c),))
    atoms = cs.partition(sets)
    rest = cs.subtract(cs.ANY, cs.union(*atoms)) if atoms else cs.ANY
    if rest:
        atoms.append(rest)
    atoms = [cs.intersect(a, cs.ANY) for a in atoms]
    atoms = [a for a in atoms if a]
    cap = max_len if max_len is not None else min_len
    start = (tuple(eps_closure(n, [n.start]) for n in pn), tuple(eps_closure(n, [n.start]) for n in nn), 0, 0)
    index = {start: 0}
    order = [start]
    dfa = DFA()
    dfa.trans.append([])
    i = 0
    while i < len(order):
        ps, ns, tnode, cnt = order[i]
        if (all(n.final in s for n, s in zip(pn, ps)) and not any(n.final in s for n, s in zip(nn, ns))
                and tnode not in ends and cnt >= min_len):
            dfa.accept.add(i)
        if max_len is None or cnt < max_len:
            ncnt = cnt + 1 if cnt < cap else cnt
            by_target: dict = {}
            for atom in atoms:
                cp = atom[0][0]
                nps = []
                dead = False
                for n, s in zip(pn, ps):
                    t = step(n, s, cp)
                    if not t:
                        dead = True
                        break
                    nps.append(t)
                if dead:
                    continue
                nns = tuple(step(n, s, cp) if s else s for n, s in zip(nn, ns))
                nt = trie[tnode].get(cp, -1) if tnode >= 0 and len(atom) == 1 and atom[0][0] == atom[0][1] else -1
                key = (tuple(nps), nns, nt, ncnt)
                j = index.get(key)
                if j is None:
                    j = len(order)
                    if j >= max_states:
                        raise AutomatonLimit("string_automaton_states", f"string automaton exceeds {max_states} states")
                    index[key] = j
                    order.append(key)
                    dfa.trans.append([])
                by_target.setdefault(j, []).extend(atom)
            dfa.trans[i] = [(cs.normalize(r), j) for j, r in by_target.items()]
        i += 1
    return prune(dfa)


def _string_rule(em, pos, neg, excluded, min_len, max_len, where, hint="s",
                 max_states: int = MAX_STATES) -> str | None:
    """Rule name of the canonical JSON string (with quotes) of lang_dfa(...); None if empty."""
    key = ("lang", pos, neg, tuple(sorted(excluded)), min_len, max_len)
    if key not in em.str_memo:
        try:
            dfa = lang_dfa(pos, neg, excluded, min_len, max_len, max_states)
        except AutomatonLimit as e:
            raise ConstraintError("UnsupportedSchema", f"limit {e.limit}: {e}", where)
        if not dfa.accept:
            em.str_memo[key] = None
        else:
            start, rules = dfa_to_rules(dfa, em.fresh(hint) + "_", json_mode=True)
            em.rules.extend(rules)
            name = em.fresh(hint + "q")
            em.add(name, f'"\\"" {start} "\\""')
            em.str_memo[key] = name
    return em.str_memo[key]


def string_general(em, n: String, ptr: str) -> str:
    """A string node with negative patterns (from `not`)."""
    r = _string_rule(em, n.patterns, n.neg_patterns, (), n.min_len, n.max_len, n.where or ptr)
    return r if r is not None else "[]"


def object_general(em, o: Object, ptr: str) -> str:
    """Object with patternProperties regions and/or minProperties / maxProperties, in the canonical
    order (declared properties in declared order, then the other members)."""
    where = o.where or ptr
    props = [(k, v) for k, v in o.props if not (v is NEVER) or k in o.required]
    names = [k for k, _ in o.props]
    pats = tuple(p for p, _ in o.patterns)
    kv_alts = []
    for idx, node in (o.regions if o.patterns else []):
        if node is NEVER:
            continue
        pos = tuple(pats[i] for i in idx)
        neg = tuple(p for i, p in enumerate(pats) if i not in idx)
        k = _string_rule(em, pos, neg, names, 0, None, where, "pk", MAX_KEY_STATES)
        if k is not None:
            kv_alts.append(f'{k} ":" {em.ref(node, ptr)}')
    if o.additional is not NEVER:
        if pats:
            k = _string_rule(em, (), pats, names, 0, None, where, "pk", MAX_KEY_STATES)
        else:
            k = em.key_excluding(names)
        if k is not None:
            kv_alts.append(f'{k} ":" {em.ref(o.additional, ptr)}')
    kv = None
    if kv_alts:
        kv = em.fresh("kv")
        em.add(kv, " | ".join(kv_alts))
    mn, mx = o.min_props, o.max_props
    cap = mx if mx is not None else mn
    n = len(props)
    memo: dict = {}

    def tail(c: int, first: bool) -> str:
        need = max(0, mn - c)
        room = None if mx is None else mx - c
        if kv is None or room == 0:
            return '""' if need == 0 else "[]"
        if first:
            more = repeat(f'("," {kv})', max(need - 1, 0), None if room is None else room - 1, em.expand)
            body = f"{kv} {more}"
            return f"({body})?" if need == 0 else f"({body})"
        return repeat(f'("," {kv})', need, room, em.expand)

    def S(i: int, c: int, first: bool) -> str:
        k = (i, c, first)
        if k in memo:
            return memo[k]
        if i == n:
            memo[k] = tail(c, first)
            return memo[k]
        name, node = props[i]
        rule = em.fresh("o")
        memo[k] = rule
        alts = []
        if mx is None or c < mx:
            sep = "" if first else '"," '
            from .emit import json_literal
            alts.append(f'{sep}{json_literal(name)} ":" {em.ref(node, ptr)} {S(i + 1, min(c + 1, cap) if mx is None else c + 1, False)}')
        if name not in o.required:
            alts.append(S(i + 1, c, first))
        em.add(rule, " | ".join(alts) if alts else "[]")
        return rule

    return f'"{{" {S(0, 0, True)} "}}"'
