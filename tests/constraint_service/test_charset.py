"""Code-point set algebra (regex/charset): complement, intersect, subtract and union against Python sets
of code points, on random normalized sets drawn near the surrogate gap and the ends of the scalar range
(where the one-pass merges have their edge cases)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from constraint_service.regex import charset as cs

# Points where range arithmetic has edges: 0, the surrogates' borders, MAX_CP; plus a small window of
# ordinary code points. Sets are drawn as ranges inside this universe and checked through it.
EDGES = [0, 1, 2, 0x41, 0x42, 0x43, cs.SURR_LO - 2, cs.SURR_LO - 1, cs.SURR_LO, cs.SURR_LO + 1,
         cs.SURR_HI - 1, cs.SURR_HI, cs.SURR_HI + 1, cs.SURR_HI + 2, 0xFFFF, 0x10000, 0x70000, 0x80000,
         cs.MAX_CP - 1, cs.MAX_CP]
PROBES = sorted({p + d for p in EDGES for d in (-1, 0, 1) if 0 <= p + d <= cs.MAX_CP})

bound = st.one_of(st.sampled_from(EDGES), st.integers(0, cs.MAX_CP))  # edges, and random interior bounds
ranges = st.lists(st.tuples(bound, bound).map(lambda t: (min(t), max(t))), max_size=6)
sets = ranges.map(cs.normalize)


def members(s, extra=()) -> set[int]:
    """The probe points (plus ``extra``) in ``s``."""
    return {p for p in (*PROBES, *extra) if cs.contains(s, p)}


def probes_of(*sets_) -> list[int]:
    """Each range end of the sets, and its neighbours: where a wrong result would show."""
    return sorted({q for s in sets_ for lo, hi in s for p in (lo, hi) for q in (p - 1, p, p + 1)
                   if 0 <= q <= cs.MAX_CP})


def is_normalized(s) -> bool:
    """Sorted, disjoint, non-adjacent ranges of scalar values (no surrogates)."""
    for k, (lo, hi) in enumerate(s):
        if lo > hi or (hi >= cs.SURR_LO and lo <= cs.SURR_HI) or lo < 0 or hi > cs.MAX_CP:
            return False
        if k and lo <= s[k - 1][1] + 1:
            return False
    return True


SCALARS = {p for p in PROBES if not cs.SURR_LO <= p <= cs.SURR_HI}


@settings(max_examples=400, deadline=None)
@given(sets, sets)
def test_set_algebra_matches_python_sets(a, b):
    assert is_normalized(a) and is_normalized(b)
    x = probes_of(a, b)
    scalars = SCALARS | {p for p in x if not cs.SURR_LO <= p <= cs.SURR_HI}
    for got, want in [(cs.complement(a), scalars - members(a, x)),
                      (cs.intersect(a, b), members(a, x) & members(b, x)),
                      (cs.subtract(a, b), members(a, x) - members(b, x)),
                      (cs.union(a, b), members(a, x) | members(b, x))]:
        assert type(got) is tuple and all(type(r) is tuple for r in got), got  # hashable: cached by value
        assert is_normalized(got), got
        assert members(got, x) == want
    assert cs.size(cs.intersect(a, b)) + cs.size(cs.subtract(a, b)) == cs.size(a)
    assert cs.complement(cs.complement(a)) == a
    assert cs.intersect(a, b) == cs.intersect(b, a)


def test_normalize_drops_surrogates_and_merges_adjacent():
    assert cs.normalize([(5, 9), (0, 4), (20, 10)]) == ((0, 9),)
    assert cs.normalize([(cs.SURR_LO - 1, cs.SURR_HI + 1)]) == ((cs.SURR_LO - 1, cs.SURR_LO - 1),
                                                               (cs.SURR_HI + 1, cs.SURR_HI + 1))
    assert cs.complement(()) == cs.ANY and cs.complement(cs.ANY) == ()
