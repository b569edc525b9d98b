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
from ..regex import AutomatonLimit, build_nfa, charset as cs, parse_regex, search_ast
from ..regex.automaton import DFA, AtomStepper, check_length_bounds, eps_closure, explore, nfa_charsets, step
from ..regex.ebnf import json_literal, repeat
from .ir import NEVER, Object, String, is_empty
from .formats import LEAP_PATTERNS

MAX_STATES = 65_536
MAX_KEY_STATES = 4_096  # one key class of patternProperties (built in pure Python: keep it quick)
MAX_LEN_BOUND = 8_192


def _nfa(p: str):
    return build_nfa(search_ast(parse_regex(p, "UnsupportedSchema")))


_DONE = frozenset([-1])  # a positive pattern that has matched for good


def _universal(nfa, atoms) -> frozenset:
    """NFA states from which every continuation (over `atoms`, a partition of all code points that
    refines the NFA's character sets) reaches the final state: the greatest set U of states whose
    closure holds the final state and which, on every atom, step to a state of U."""
    clo = [eps_closure(nfa, [q]) for q in range(len(nfa.trans))]
    u = {q for q in range(len(nfa.trans)) if nfa.final in clo[q]}
    changed = True
    while changed:
        changed = False
        for q in list(u):
            for atom in atoms:
                if not (step(nfa, clo[q], atom[0][0]) & u):
                    u.discard(q)
                    changed = True
                    break
    return frozenset(u)


def lang_dfa(pos: tuple, neg: tuple, excluded=(), min_len: int = 0, max_len: int | None = None,
             max_states: int = MAX_STATES) -> DFA:
    """DFA (code points, start state 0) of the strings matching every pattern in `pos` (search
    semantics), none in `neg`, not equal to any of `excluded`, with min_len <= length <= max_len.
    Raises AutomatonLimit past max_states states or a length bound over MAX_LEN_BOUND."""
    check_length_bounds(min_len, max_len, MAX_LEN_BOUND)
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
    # states from which every continuation matches (a search pattern already found): a positive
    # pattern there is satisfied for good (one marker state), a negative one kills the string; without
    # this the product keeps tracking the NFA positions of matched patterns (many dead states)
    pu = [_universal(n, atoms) for n in pn]
    nu = [_universal(n, atoms) for n in nn]

    def norm_pos(sets):
        return tuple(_DONE if (s is _DONE or s & u) else s for s, u in zip(sets, pu))

    psteps = [AtomStepper(n, atoms) for n in pn]
    nsteps = [AtomStepper(n, atoms) for n in nn]
    none = frozenset()

    def moves(core):  # core = (positive pattern subsets, negative pattern subsets, trie node or -1)
        ps, ns, tnode = core
        pper = [None if s is _DONE else st.steps(s) for st, s in zip(psteps, ps)]
        nper = [st.steps(s) if s else None for st, s in zip(nsteps, ns)]
        out = []
        for i, atom in enumerate(atoms):
            nps = []
            for s, d in zip(ps, pper):
                t = s if d is None else d.get(i)
                if t is None:
                    break
                nps.append(t)
            else:
                nns = tuple(d.get(i, none) if d is not None else s for s, d in zip(ns, nper))
                cp = atom[0][0]
                nt = trie[tnode].get(cp, -1) if tnode >= 0 and len(atom) == 1 and cp == atom[0][1] else -1
                out.append((atom, (norm_pos(nps), nns, nt)))
        return out

    def accepting(core):
        ps, ns, tnode = core
        return (all(s is _DONE or n.final in s for n, s in zip(pn, ps)) and not any(n.final in s for n, s in zip(nn, ns))
                and tnode not in ends)

    def forbidden(core):  # a forbidden pattern matched: no string through here is in the language
        return any(s & u for s, u in zip(core[1], nu))

    start = (norm_pos(tuple(eps_closure(n, [n.start]) for n in pn)), tuple(eps_closure(n, [n.start]) for n in nn), 0)
    return explore(start, moves, accepting, min_len, max_len, max_states, dead=forbidden)


MAX_ENUM_KEYS = 64  # a finite class of undeclared keys up to this size is written out key by key


def dfa_strings(dfa: DFA, limit: int) -> list[str] | None:
    """The strings of a pruned DFA's language, sorted, when it is finite with at most `limit` strings;
    None otherwise (a reachable cycle, or more strings)."""
    n = len(dfa.trans)
    if not dfa.accept:
        return []
    state = [0] * n  # 0 new, 1 on the stack, 2 done
    order = []
    stack = [(0, iter(dfa.trans[0]))]
    state[0] = 1
    while stack:
        s, it = stack[-1]
        for _, t in it:
            if state[t] == 1:
                return None  # cycle: infinitely many strings
            if state[t] == 0:
                state[t] = 1
                stack.append((t, iter(dfa.trans[t])))
                break
        else:
            stack.pop()
            state[s] = 2
            order.append(s)
    count = {}
    for s in order:  # successors first
        c = 1 if s in dfa.accept else 0
        for r, t in dfa.trans[s]:
            c += cs.size(r) * count[t]
        if c > limit:
            return None
        count[s] = c
    out = []

    def walk(s, prefix):
        if s in dfa.accept:
            out.append(prefix)
        for r, t in dfa.trans[s]:
            for lo, hi in r:
                for cp in range(lo, hi + 1):
                    walk(t, prefix + chr(cp))
    walk(0, "")
    return sorted(out)


def key_classes(o: Object):
    """The classes of undeclared member names of `o`: [(patterns matched, patterns not matched, value
    node)] for every non-empty patternProperties region and for additionalProperties, skipping NEVER."""
    pats = tuple(p for p, _ in o.patterns)
    out = []
    for idx, node in (o.regions if o.patterns else []):
        if not is_empty(node):
            out.append((tuple(pats[i] for i in idx), tuple(p for i, p in enumerate(pats) if i not in idx), node))
    if not is_empty(o.additional):
        out.append(((), pats, o.additional))
    return out


def finite_keys(pos: tuple, neg: tuple, names, limit: int = MAX_ENUM_KEYS) -> list[str] | None:
    """The keys of one class (matching `pos`, not `neg`, none of `names`) when finitely many (at most
    `limit`), sorted; None when infinite, larger, or past the key automaton limit."""
    if not pos and not neg:
        return None  # every undeclared name
    try:
        return dfa_strings(lang_dfa(pos, neg, tuple(names), 0, None, MAX_KEY_STATES), limit)
    except AutomatonLimit:
        return None


def enumerated_keys(o: Object) -> list[tuple]:
    """[(key, value node)] of the undeclared keys that object_general writes out one by one (the
    members of finite key classes, sorted), so that no key repeats and member counts are exact;
    empty for objects without patternProperties."""
    if not o.patterns:
        return []
    names = [k for k, _ in o.props]
    out = []
    for pos, neg, node in key_classes(o):
        keys = finite_keys(pos, neg, names)
        if keys is not None:
            out += [(k, node) for k in keys]
    return sorted(out, key=lambda kv: kv[0])


def undeclared_capacity(o: Object, need: int) -> int:
    """How many distinct undeclared members `o` admits, capped at `need` (so an infinite class costs
    no more than counting `need` of its keys)."""
    names = [k for k, _ in o.props]
    total = 0
    for pos, neg, _ in key_classes(o):
        keys = finite_keys(pos, neg, names, need)
        total += need if keys is None else len(keys)
        if total >= need:
            return need
    return total


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
            # one rule per state with the closing quote inside the accepting ones and the string lookahead
            # (Emitter.dfa_string): a token that closes a key or value and runs on is decided while xgrammar
            # precompiles masks, instead of at every mask (language-tag keys, Github_trivial---o76654: 1.3 ms
            # -> 11 us per mask, mean, 2-core dev box)
            name = em.fresh(hint + "q")
            em.add(name, em.dfa_string(dfa))
            em.str_memo[key] = name
    return em.str_memo[key]


def string_general(em, n: String, ptr: str) -> str:
    """A string node with negative patterns (from `not`)."""
    # a positive time / date-time format is generated without leap seconds here (formats.LEAP_FORMATS);
    # a negative one keeps its whole language (its complement must not admit a leap second)
    pos = tuple(LEAP_PATTERNS[p][1] if p in LEAP_PATTERNS else p for p in n.patterns)
    r = _string_rule(em, pos, n.neg_patterns, (), n.min_len, n.max_len, n.where or ptr)
    return r if r is not None else "[]"


def object_general(em, o: Object, ptr: str) -> str:
    """Object with patternProperties regions and/or minProperties / maxProperties, in the canonical
    order (declared properties in declared order, then the members of finite key classes in sorted
    order, then the other members). Only choices that can still complete are offered (no dead ends)."""
    where = o.where or ptr
    names = [k for k, _ in o.props]
    props = [(k, v) for k, v in o.props if not is_empty(v) or k in o.required]
    listed = enumerated_keys(o)
    props += listed
    listed_keys = {k for k, _ in listed}
    kv_alts = []
    for pos, neg, node in key_classes(o):
        if pos or neg:
            if finite_keys(pos, neg, names) is not None:
                continue  # written out above
            k = _string_rule(em, pos, neg, names, 0, None, where, "pk", MAX_KEY_STATES)
        else:
            k = em.key_excluding(names)
        if k is not None:
            kv_alts.append(f'{k} ":" {em.ref(node, ptr)}')
    assert not (listed_keys & set(names))
    kv = None
    if kv_alts:
        kv = em.fresh("kv")
        em.add(kv, " | ".join(kv_alts))
    mn, mx = o.min_props, o.max_props
    cap = mx if mx is not None else mn
    n = len(props)
    avail = [0] * (n + 1)  # members still possible from property i on (declared and listed)
    req = [0] * (n + 1)    # of which required
    for i in range(n - 1, -1, -1):
        avail[i] = avail[i + 1] + 1
        req[i] = req[i + 1] + (props[i][0] in o.required)
    memo: dict = {}

    def feasible(i: int, c: int) -> bool:
        if mx is not None and c + req[i] > mx:
            return False
        return kv is not None or c + avail[i] >= mn

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
        nc = min(c + 1, cap) if mx is None else c + 1
        if (mx is None or c < mx) and feasible(i + 1, nc):
            sep = "" if first else '"," '
            alts.append(f'{sep}{json_literal(name)} ":" {em.ref(node, ptr)} {S(i + 1, nc, False)}')
        if name not in o.required and feasible(i + 1, c):
            alts.append(S(i + 1, c, first))
        em.add(rule, " | ".join(alts) if alts else "[]")
        return rule

    return f'"{{" {S(0, 0, True)} "}}"'
