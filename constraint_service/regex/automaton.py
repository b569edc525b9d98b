"""Thompson NFA, NFA simulation and on-the-fly product DFAs (used for pattern/length intersection)."""
from __future__ import annotations

import bisect

from . import charset as cs


class AutomatonLimit(Exception):
    """Raised when an automaton would exceed a configured limit; .limit names it."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


class NFA:
    __slots__ = ("trans", "eps", "start", "final")

    def __init__(self):
        self.trans: list[list] = []  # state -> [(ranges, target)]
        self.eps: list[list] = []
        self.start = 0
        self.final = 0

    def new(self) -> int:
        self.trans.append([])
        self.eps.append([])
        return len(self.trans) - 1


def build_nfa(node, max_states: int = 200_000) -> NFA:
    nfa = NFA()

    def check():
        if len(nfa.trans) > max_states:
            raise AutomatonLimit("nfa_states", f"regex automaton exceeds {max_states} NFA states")

    def build(n, s):  # returns end state, starting from s
        kind = n[0]
        if kind == "chars":
            e = nfa.new()
            if n[1]:
                nfa.trans[s].append((n[1], e))
            return e
        if kind == "cat":
            cur = s
            for c in n[1]:
                cur = build(c, cur)
                check()
            return cur
        if kind == "alt":
            e = nfa.new()
            for c in n[1]:
                b = nfa.new()
                nfa.eps[s].append(b)
                be = build(c, b)
                nfa.eps[be].append(e)
            return e
        if kind == "rep":
            _, sub, lo, hi = n
            cur = s
            for _ in range(lo):
                cur = build(sub, cur)
                check()
            if hi is None:
                loop = nfa.new()
                nfa.eps[cur].append(loop)
                be = build(sub, loop)
                nfa.eps[be].append(loop)
                return loop
            e = nfa.new()
            nfa.eps[cur].append(e)
            for _ in range(hi - lo):
                nxt = build(sub, cur)
                nfa.eps[nxt].append(e)
                cur = nxt
                check()
            return e
        raise ValueError(kind)

    nfa.start = nfa.new()
    nfa.final = build(node, nfa.start)
    check()
    return nfa


def eps_closure(nfa: NFA, states) -> frozenset:
    stack = list(states)
    seen = set(stack)
    while stack:
        s = stack.pop()
        for t in nfa.eps[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return frozenset(seen)


def step(nfa: NFA, states: frozenset, cp: int) -> frozenset:
    nxt = set()
    for s in states:
        for rs, t in nfa.trans[s]:
            if cs.contains(rs, cp):
                nxt.add(t)
    return eps_closure(nfa, nxt) if nxt else frozenset()


class AtomStepper:
    """``step`` of one NFA for every atom at once: ``steps(states)[i]`` is ``step(nfa, states, cp)`` for
    any ``cp`` of ``atoms[i]`` (absent when empty).

    ``atoms`` are disjoint code-point sets that refine the NFA's character sets (each charset holds an
    atom whole or not at all, as ``charset.partition`` makes them), so one walk over the states'
    transitions gives every atom's targets. Epsilon closures are kept by target set (a value, so the
    stepper is a pure function of the NFA and atoms)."""

    def __init__(self, nfa: NFA, atoms: list) -> None:
        self.nfa = nfa
        firsts = sorted((a[0][0], i) for i, a in enumerate(atoms))
        keys = [f for f, _ in firsts]
        self.atoms_of: dict = {}  # charset -> indices of the atoms inside it
        for tr in nfa.trans:
            for rs, _ in tr:
                if rs not in self.atoms_of:
                    self.atoms_of[rs] = [firsts[k][1] for lo, hi in rs
                                         for k in range(bisect.bisect_left(keys, lo), bisect.bisect_right(keys, hi))]
        self.closures: dict = {}

    def steps(self, states) -> dict:
        by_atom: dict = {}
        trans = self.nfa.trans
        for s in states:
            for rs, t in trans[s]:
                for i in self.atoms_of[rs]:
                    ts = by_atom.get(i)
                    if ts is None:
                        by_atom[i] = {t}
                    else:
                        ts.add(t)
        out = {}
        for i, ts in by_atom.items():
            key = frozenset(ts)
            c = self.closures.get(key)
            if c is None:
                c = self.closures[key] = eps_closure(self.nfa, key)
            out[i] = c
        return out


def nfa_matches(nfa: NFA, text: str) -> bool:
    cur = eps_closure(nfa, [nfa.start])
    for ch in text:
        cur = step(nfa, cur, ord(ch))
        if not cur:
            return False
    return nfa.final in cur


def nfa_charsets(nfa: NFA):
    return {rs for tr in nfa.trans for rs, _ in tr}


class DFA:
    """states: 0..n-1, start 0; trans[s] = [(ranges, target)]; accept = set of states."""

    def __init__(self):
        self.trans: list[list] = []
        self.accept: set[int] = set()


def check_length_bounds(min_len: int | None, max_len: int | None, bound: int) -> None:
    """Raise ``AutomatonLimit("string_length_bound")`` when a length bound of a string automaton is over
    ``bound``; the message names ``max_len`` when both are."""
    for b in (max_len, min_len):
        if b is not None and b > bound:
            raise AutomatonLimit("string_length_bound", f"string automaton length bound {b} exceeds {bound}")


def _grouped(out) -> list:
    """``moves``' ``(atom, next core)`` list as ``(next core, normalized union of its atoms)`` in the
    order of each next core's first atom. From a state with count c every next core goes to one state
    (next core, c'), so this grouping is the state's transition list whatever c is: computed once per
    core rather than once per (core, count) state."""
    by_next: dict = {}
    for atom, nxt in out:
        by_next.setdefault(nxt, []).extend(atom)
    return [(nxt, cs.normalize(r)) for nxt, r in by_next.items()]


def explore(start, moves, accepting, min_len: int = 0, max_len: int | None = None,
            max_states: int = 65_536, dead=None) -> DFA:
    """The pruned DFA of a product construction with a length counter (code points).

    States are pairs (core, count) reached breadth-first from (``start``, 0); the count saturates at
    ``max_len`` (or at ``min_len`` when there is no maximum). ``moves(core)`` lists ``(atom, next core)``
    in a fixed order (atoms: disjoint code-point ranges); it does not depend on the count, so it runs
    once per core (a length bound of N visits a core up to N + 1 times). A state accepts when
    ``accepting(core)`` and count >= ``min_len``; a core with ``dead(core)`` true neither accepts nor
    moves. Transitions to the same state are merged into one range set.

    Raises:
        AutomatonLimit: ``string_automaton_states`` past ``max_states`` states, counted before pruning
            (dead states and states that cannot reach acceptance are numbered and count too).
        ValueError: ``min_len`` or ``max_len`` is not a non-negative int.
    """
    for b in (min_len, max_len):
        if b is not None and (not isinstance(b, int) or b < 0):
            raise ValueError(f"length bounds must be non-negative ints, got {min_len!r}, {max_len!r}")
    cap = max_len if max_len is not None else min_len
    width = cap + 1  # a state (core c, count n) is the int c * width + n
    ids = {start: 0}  # core -> core id, in first-reached order
    cores = [start]
    memo: list = [None]  # per core id: its transitions as (next core id * width, ranges), None until first moved
    kinds: list = [None]  # per core id: 0 dead, 1 live, 2 live and accepting at count >= min_len
    index = {0: 0}  # state -> DFA state number
    order = [0]
    dfa = DFA()
    dfa.trans.append([])
    i = 0
    while i < len(order):
        c, cnt = divmod(order[i], width)
        kind = kinds[c]
        if kind is None:
            core = cores[c]
            kind = kinds[c] = 0 if dead is not None and dead(core) else 2 if accepting(core) else 1
        if kind == 0:
            i += 1
            continue
        if kind == 2 and cnt >= min_len:
            dfa.accept.add(i)
        if max_len is None or cnt < max_len:
            ncnt = cnt + 1 if cnt < cap else cnt
            out = memo[c]
            if out is None:
                out = memo[c] = []
                for nxt, ranges in _grouped(moves(cores[c])):
                    nc = ids.get(nxt)
                    if nc is None:
                        nc = ids[nxt] = len(cores)
                        cores.append(nxt)
                        memo.append(None)
                        kinds.append(None)
                    out.append((nc * width, ranges))
            trans = []
            for base, ranges in out:
                key = base + ncnt
                j = index.get(key)
                if j is None:
                    j = len(order)
                    if j >= max_states:
                        raise AutomatonLimit("string_automaton_states",
                                             f"string automaton exceeds {max_states} states")
                    index[key] = j
                    order.append(key)
                    dfa.trans.append([])
                trans.append((ranges, j))
            dfa.trans[i] = trans
        i += 1
    return prune(dfa)


def product_dfa(nfas: list, min_len: int = 0, max_len: int | None = None,
                max_states: int = 65_536, max_len_bound: int = 8_192) -> DFA:
    """DFA of the intersection of the NFAs' languages and min_len <= len <= max_len (code points)."""
    check_length_bounds(min_len, max_len, max_len_bound)
    sets = set()
    for n in nfas:
        sets |= nfa_charsets(n)
    atoms = [a for a in cs.partition(sets) if any(cs.contains(s, a[0][0]) for s in sets)]

    steppers = [AtomStepper(n, atoms) for n in nfas]

    def moves(subsets):
        per = [st.steps(ss) for st, ss in zip(steppers, subsets)]
        common = set(per[0]).intersection(*per[1:]) if per else set()
        return [(atoms[i], tuple(p[i] for p in per)) for i in sorted(common)]

    start = tuple(eps_closure(n, [n.start]) for n in nfas)
    return explore(start, moves, lambda subsets: all(n.final in ss for n, ss in zip(nfas, subsets)),
                   min_len, max_len, max_states)


def prune(dfa: DFA) -> DFA:
    """Remove states that cannot reach an accepting state."""
    n = len(dfa.trans)
    rev = [[] for _ in range(n)]
    for s, tr in enumerate(dfa.trans):
        for _, t in tr:
            rev[t].append(s)
    live = set(dfa.accept)
    stack = list(live)
    while stack:
        s = stack.pop()
        for p in rev[s]:
            if p not in live:
                live.add(p)
                stack.append(p)
    out = DFA()
    if 0 not in live:
        out.trans = [[]]
        return out
    remap = {}
    order = [0]
    remap[0] = 0
    k = 0
    while k < len(order):
        s = order[k]
        for _, t in dfa.trans[s]:
            if t in live and t not in remap:
                remap[t] = len(order)
                order.append(t)
        k += 1
    out.trans = [[(r, remap[t]) for r, t in dfa.trans[s] if t in live] for s in order]
    out.accept = {remap[s] for s in order if s in dfa.accept}
    return out


def dfa_is_empty(dfa: DFA) -> bool:
    return not dfa.accept


def minimize(dfa: DFA) -> DFA:
    """The minimal DFA of ``dfa``'s language (Moore's partition refinement), states numbered breadth-first
    from the start, transitions in the order of their first code point: a function of ``dfa``'s language
    and transitions alone.

    Code points are cut into atoms (``charset.partition`` of every transition's ranges), and atoms that lead
    every state to the same state are one column; a state's signature in a round is its block and its
    column-by-column target blocks. Two states end in one block when both accept or both reject and every
    code point leads them to states of one block. Each round is O(states x columns), at most ``len(dfa.trans)``
    rounds (a chain of n states takes n).
    """
    n = len(dfa.trans)
    atoms = cs.partition({r for tr in dfa.trans for r, _ in tr})
    firsts = [a[0][0] for a in atoms]  # ascending: partition cuts in order
    rows = []  # per state: target per atom (-1: none)
    for tr in dfa.trans:
        row = [-1] * len(atoms)
        for ranges, t in tr:
            for lo, hi in ranges:
                for k in range(bisect.bisect_left(firsts, lo), bisect.bisect_right(firsts, hi)):
                    row[k] = t
        rows.append(row)
    columns: dict = {}  # the targets of an atom over all states -> its atoms
    for k in range(len(atoms)):
        columns.setdefault(tuple(row[k] for row in rows), []).append(k)
    cols = list(columns)
    table = [tuple(col[s] for col in cols) for s in range(n)]
    block = [1 if s in dfa.accept else 0 for s in range(n)]
    count = len(set(block))
    while True:
        sigs: dict = {}
        block = [sigs.setdefault((block[s], tuple(-1 if t < 0 else block[t] for t in table[s])), len(sigs))
                 for s in range(n)]
        if len(sigs) == count:
            break
        count = len(sigs)
    col_ranges = [cs.normalize([r for k in columns[c] for r in atoms[k]]) for c in cols]
    col_order = sorted(range(len(cols)), key=lambda j: col_ranges[j][0][0])
    first: dict = {}  # block -> its first state (all members lead to the same blocks)
    for st in range(n):
        first.setdefault(block[st], st)
    number = {block[0]: 0}
    order = [block[0]]
    out = DFA()
    i = 0
    while i < len(order):
        st = first[order[i]]
        by: dict = {}  # target block -> ranges, in order of first code point
        for j in col_order:
            t = table[st][j]
            if t >= 0:
                by.setdefault(block[t], []).extend(col_ranges[j])
        trans = []
        for b, r in by.items():
            if b not in number:
                number[b] = len(order)
                order.append(b)
            trans.append((cs.normalize(r), number[b]))
        out.trans.append(trans)
        if st in dfa.accept:
            out.accept.add(i)
        i += 1
    return out
