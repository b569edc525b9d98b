"""Code-point sets as sorted tuples of disjoint inclusive ranges (Unicode scalar values only)."""
from __future__ import annotations

MAX_CP = 0x10FFFF
SURR_LO, SURR_HI = 0xD800, 0xDFFF

Ranges = tuple  # tuple[tuple[int, int], ...]


def normalize(ranges) -> Ranges:
    rs = sorted((lo, hi) for lo, hi in ranges if lo <= hi)
    out: list[list[int]] = []
    for lo, hi in rs:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    # remove surrogates
    res = []
    for lo, hi in out:
        if hi < SURR_LO or lo > SURR_HI:
            res.append((lo, hi))
        else:
            if lo < SURR_LO:
                res.append((lo, SURR_LO - 1))
            if hi > SURR_HI:
                res.append((SURR_HI + 1, hi))
    return tuple(res)


ANY: Ranges = normalize([(0, MAX_CP)])
EMPTY: Ranges = ()


def union(*sets) -> Ranges:
    return normalize([r for s in sets for r in s])


def _append_scalar(out: list, lo: int, hi: int) -> None:
    """Append [lo, hi] minus the surrogates to ``out`` (ranges in order)."""
    if hi < SURR_LO or lo > SURR_HI:
        out.append((lo, hi))
        return
    if lo < SURR_LO:
        out.append((lo, SURR_LO - 1))
    if hi > SURR_HI:
        out.append((SURR_HI + 1, hi))


def complement(s: Ranges) -> Ranges:
    """The scalar values not in ``s`` (``s`` normalized); one pass over its gaps."""
    out: list = []
    prev = 0
    for lo, hi in s:
        if lo > prev:
            _append_scalar(out, prev, lo - 1)
        prev = hi + 1
    if prev <= MAX_CP:
        _append_scalar(out, prev, MAX_CP)
    return tuple(out)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    """``a`` ∩ ``b`` for normalized sets, by one merge pass (the result is normalized: ranges of one
    normalized set are neither overlapping nor adjacent, so their pieces are not either)."""
    out = []
    i = j = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        alo, ahi = a[i]
        blo, bhi = b[j]
        lo = alo if alo > blo else blo
        hi = ahi if ahi < bhi else bhi
        if lo <= hi:
            out.append((lo, hi))
        if ahi < bhi:
            i += 1
        else:
            j += 1
    return tuple(out)


def subtract(a: Ranges, b: Ranges) -> Ranges:
    return intersect(a, complement(b))


def contains(s: Ranges, cp: int) -> bool:
    lo_i, hi_i = 0, len(s)
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        lo, hi = s[mid]
        if cp < lo:
            hi_i = mid
        elif cp > hi:
            lo_i = mid + 1
        else:
            return True
    return False


def size(s: Ranges) -> int:
    return sum(hi - lo + 1 for lo, hi in s)


def sample(s: Ranges) -> int:
    return s[0][0]


# ECMAScript classes
DIGIT = normalize([(0x30, 0x39)])
WORD = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
# WhiteSpace + LineTerminator per ECMA-262: TAB VT FF SP NBSP ZWNBSP USP(Zs) LF CR LS PS
SPACE = normalize([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                   (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                   (0xFEFF, 0xFEFF)])
DOT = complement(normalize([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))


def partition(sets) -> list[Ranges]:
    """Split the union of `sets` into atoms: maximal intervals on which membership in every set is constant."""
    points = set()
    for s in sets:
        for lo, hi in s:
            points.add(lo)
            points.add(hi + 1)
    pts = sorted(points)
    atoms = []
    for i in range(len(pts) - 1):
        lo, hi = pts[i], pts[i + 1] - 1
        a = normalize([(lo, hi)])
        if a:
            atoms.append(a)
    return atoms
