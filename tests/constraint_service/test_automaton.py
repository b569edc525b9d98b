"""String automata: the product construction with a length counter (regex/automaton.explore) and its two
users, product_dfa (regex intersections with length bounds) and keys.lang_dfa (positive / negative search
patterns, excluded names), against brute-force oracles over every short string of a small alphabet."""
from __future__ import annotations

import itertools
import re

import pytest

from constraint_service.json_schema.keys import lang_dfa
from constraint_service.regex import AutomatonLimit, build_nfa, parse_regex, product_dfa
from constraint_service.regex import charset as cs
from constraint_service.regex import full_ast
from constraint_service.regex.automaton import check_length_bounds, explore

ALPHABET = "ab1-"


def accepts(dfa, text: str) -> bool:
    """Walk a DFA (start state 0) over the code points of ``text``."""
    state = 0
    for ch in text:
        for ranges, target in dfa.trans[state]:
            if cs.contains(ranges, ord(ch)):
                state = target
                break
        else:
            return False
    return state in dfa.accept


def check_shape(dfa) -> None:
    """A pruned DFA: every state reaches an accepting one; per state, one transition per target and
    pairwise disjoint ranges (deterministic)."""
    n = len(dfa.trans)
    live = set(dfa.accept)
    changed = True
    while changed:
        changed = False
        for s, tr in enumerate(dfa.trans):
            if s not in live and any(t in live for _, t in tr):
                live.add(s)
                changed = True
    assert live == set(range(n)) or (n == 1 and not dfa.accept)
    for tr in dfa.trans:
        targets = [t for _, t in tr]
        assert len(targets) == len(set(targets))
        points = sorted(r for ranges, _ in tr for r in ranges)
        assert all(a[1] < b[0] for a, b in zip(points, points[1:]))


def strings(max_len: int):
    for n in range(max_len + 1):
        for t in itertools.product(ALPHABET, repeat=n):
            yield "".join(t)


A, B = ((ord("a"), ord("a")),), ((ord("b"), ord("b")),)


def parity_moves(core):
    """Core = number of 'a' seen mod 2; 'b' keeps it."""
    return [(A, 1 - core), (B, core)]


@pytest.mark.parametrize("min_len,max_len", [(0, None), (2, None), (0, 3), (1, 4), (3, 3)])
def test_explore_counts_length_and_keeps_the_core_language(min_len, max_len):
    dfa = explore(0, parity_moves, lambda core: core == 0, min_len, max_len)
    for text in strings(6):
        want = (set(text) <= {"a", "b"} and text.count("a") % 2 == 0 and len(text) >= min_len
                and (max_len is None or len(text) <= max_len))
        assert accepts(dfa, text) == want, text


def test_explore_dead_core_neither_accepts_nor_moves():
    # core 2 is reached by "bb" and is dead: nothing through it is accepted, even though accepting(2) holds
    moves = lambda core: [(A, 0), (B, core + 1)] if core < 2 else [(A, 0), (B, 2)]  # noqa: E731
    dfa = explore(0, moves, lambda core: True, dead=lambda core: core == 2)
    for text in strings(5):
        if set(text) <= {"a", "b"}:
            assert accepts(dfa, text) == ("bb" not in text), text


def test_explore_state_limit_and_length_bound():
    with pytest.raises(AutomatonLimit) as e:
        explore(0, parity_moves, lambda core: True, 0, 50, max_states=20)
    assert e.value.limit == "string_automaton_states"
    # (0, 0) and 2 cores x counts 1..50: 101 states, so the limit is exact
    explore(0, parity_moves, lambda core: True, 0, 50, max_states=101)
    with pytest.raises(AutomatonLimit):
        explore(0, parity_moves, lambda core: True, 0, 50, max_states=100)
    with pytest.raises(AutomatonLimit) as e:
        check_length_bounds(0, 9, 8)
    assert e.value.limit == "string_length_bound"
    with pytest.raises(AutomatonLimit):
        check_length_bounds(9, None, 8)
    check_length_bounds(8, 8, 8)


@pytest.mark.parametrize("patterns,min_len,max_len", [
    (["[ab]+"], 0, None),
    (["a*b*", "[ab]{2,3}"], 0, None),
    (["[a-b1]*", "(a|1)*"], 1, 3),
    (["(ab|b)*-?"], 2, None),
    (["a+", "b+"], 0, None),  # empty intersection
])
def test_product_dfa_is_the_intersection_with_length_bounds(patterns, min_len, max_len):
    nfas = [build_nfa(full_ast(parse_regex(p))) for p in patterns]
    dfa = product_dfa(nfas, min_len, max_len)
    check_shape(dfa)
    for text in strings(5):
        want = (all(re.fullmatch(p, text) for p in patterns) and len(text) >= min_len
                and (max_len is None or len(text) <= max_len))
        assert accepts(dfa, text) == bool(want), (patterns, text)


@pytest.mark.parametrize("pos,neg,excluded,min_len,max_len", [
    (("a",), (), (), 0, None),
    (("^a", "b$"), (), (), 0, None),
    ((), ("1",), (), 0, 3),
    (("[ab]",), ("-", "bb"), ("a", "ab"), 1, None),
    (("^[ab1]+$",), ("^1",), ("aa",), 0, 4),
])
def test_lang_dfa_is_search_patterns_minus_excluded_names(pos, neg, excluded, min_len, max_len):
    dfa = lang_dfa(pos, neg, excluded, min_len, max_len)
    check_shape(dfa)
    for text in strings(5):
        want = (all(re.search(p, text) for p in pos) and not any(re.search(p, text) for p in neg)
                and text not in excluded and len(text) >= min_len and (max_len is None or len(text) <= max_len))
        assert accepts(dfa, text) == bool(want), (pos, neg, excluded, text)


def test_length_bound_over_the_limit_is_refused_and_named():
    for call in (lambda lo, hi: lang_dfa(("a",), (), (), lo, hi),
                 lambda lo, hi: product_dfa([build_nfa(full_ast(parse_regex("a*")))], lo, hi)):
        with pytest.raises(AutomatonLimit, match="9500 exceeds 8192") as e:
            call(9000, 9500)
        assert e.value.limit == "string_length_bound"
        with pytest.raises(AutomatonLimit, match="9000 exceeds 8192"):
            call(9000, None)
        assert accepts(call(0, 8192), "a" * 8192) and not accepts(call(0, 8192), "a" * 8193)


@pytest.mark.parametrize("pattern", ["(ab|b)*-?", "[a-c]{2,4}x|\\d+", "[^ab]+a", ".\\w*[\\u00e9-\\u00ff]?",
                                     "(\\uD83D\\uDE00|[\\u0100-\\uFFFF])+", "a{0,3}(b|1){2}"])
def test_atom_stepper_steps_every_atom_like_step(pattern):
    """AtomStepper.steps(S)[i] == step(nfa, S, cp) for any cp of atom i, on the subsets the NFA reaches,
    with the atoms in any order (keys.lang_dfa appends a multi-range rest atom at the end)."""
    import random

    from constraint_service.regex.automaton import AtomStepper, eps_closure, nfa_charsets, step

    nfa = build_nfa(full_ast(parse_regex(pattern)))
    atoms = cs.partition(nfa_charsets(nfa))
    rest = cs.subtract(cs.ANY, cs.union(*atoms))
    atoms = [a for a in atoms + [rest] if a]
    random.Random(pattern).shuffle(atoms)
    stepper = AtomStepper(nfa, atoms)
    seen, todo = set(), [eps_closure(nfa, [nfa.start])]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        got = stepper.steps(s)
        for i, atom in enumerate(atoms):
            for lo, hi in atom:
                for cp in {lo, hi, (lo + hi) // 2}:
                    assert got.get(i, frozenset()) == step(nfa, s, cp), (pattern, sorted(s), atom, cp)
            if i in got:
                todo.append(got[i])
    assert len(seen) > 1


@pytest.mark.parametrize("min_len,max_len", [(-1, None), (0, -1), (2.0, None), (0, 1.5)])
def test_explore_refuses_bounds_that_are_not_non_negative_ints(min_len, max_len):
    with pytest.raises(ValueError, match="non-negative ints"):
        explore(0, parity_moves, lambda core: True, min_len, max_len)
