"""Canonical number languages: exact int64 integer ranges and binary64-safe decimal ranges."""
from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1
SAFE = 2 ** 53

# Canonical number texts are bounded (issue 13; seed 000 limits a number to 17 significant digits):
# a fraction is "0" or ends in a non-zero digit (no unbounded trailing zeros) and has at most 20 digits
# (Python's repr writes down to 1e-4 in fixed notation: 3 zeros + 17 significant digits), an integer
# part has at most 19 digits (int64), an exponent at most 3 digits.
FREE_FRAC = '("0" | [0-9]{0,19} [1-9])'
FREE_DIGITS = "[0-9]{0,15} [1-9]"  # a free fraction tail after the bound digits: ends non-zero
JSON_NUMBER = '"-"? ("0" | [1-9] [0-9]{0,18}) ("." ' + FREE_FRAC + ')? ([eE] [+\\-]? [0-9]{1,3})?'


def _same_len(lo: str, hi: str) -> str:
    """Digit strings of equal length n with lo <= s <= hi (lexicographic = numeric)."""
    n = len(lo)
    if n == 0:
        return '""'
    if lo == hi:
        return '"' + lo + '"'
    if n == 1:
        return f"[{lo}-{hi}]"
    l0, h0 = lo[0], hi[0]
    if l0 == h0:
        return f'("{l0}" {_same_len(lo[1:], hi[1:])})'
    if lo[1:] == "0" * (n - 1) and hi[1:] == "9" * (n - 1):
        return f"([{l0}-{h0}] [0-9]{{{n - 1}}})"
    alts = [f'"{l0}" {_same_len(lo[1:], "9" * (n - 1))}']
    if int(h0) - int(l0) >= 2:
        alts.append(f"[{int(l0) + 1}-{int(h0) - 1}] [0-9]{{{n - 1}}}")
    alts.append(f'"{h0}" {_same_len("0" * (n - 1), hi[1:])}')
    return "(" + " | ".join(alts) + ")"


def _nonneg_range(a: int, b: int | None) -> str:
    """Canonical decimal integers in [a, b] (b None = unbounded), 0 <= a."""
    alts = []
    la = len(str(a))
    lb = len(str(b)) if b is not None else la
    for L in range(la, lb + 1):
        lo = max(a, 0 if L == 1 else 10 ** (L - 1))
        hi = 10 ** L - 1 if b is None else min(b, 10 ** L - 1)
        if lo > hi:
            continue
        alts.append(_same_len(str(lo).rjust(L, "0"), str(hi)))
    if b is None:
        if la <= 18:  # at most 19 digits (issue 13: bounded number texts)
            alts.append(f"[1-9] [0-9]{{{la},18}}")
    if not alts:
        return "[]"
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def int_range(lo: int | None, hi: int | None) -> str:
    lo = INT64_MIN if lo is None else max(lo, INT64_MIN)
    hi = INT64_MAX if hi is None else min(hi, INT64_MAX)
    if lo > hi:
        return "[]"
    alts = []
    if hi >= 0:
        alts.append(_nonneg_range(max(lo, 0), hi))
    if lo < 0:
        alts.append('"-" ' + _nonneg_range(max(1, -min(hi, -1)) if hi < 0 else 1, -lo))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


# ---- decimals -------------------------------------------------------------

def _split(d: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    i = int(d)
    frac = d - i
    if frac == 0:
        return i, ""
    s = format(frac, "f")
    assert s.startswith("0.")
    return i, s[2:].rstrip("0")


class _FracBuilder:
    def __init__(self, rules: list, prefix: str):
        self.rules = rules
        self.prefix = prefix
        self.memo: dict = {}

    def rule(self, key, body_fn) -> str:
        if key in self.memo:
            return self.memo[key]
        name = f"{self.prefix}f{len(self.memo)}"
        self.memo[key] = name
        self.rules.append(f"{name} ::= {body_fn()}")
        return name

    # digits (>=1) with 0.d >= 0.fa and 0.d <= 0.fb ; fa/fb None = no constraint
    def digits(self, fa, fb, need_one: bool) -> str:
        """Digit string (possibly empty unless need_one) continuing a fraction under bounds."""
        if fa == "":
            fa = None
        if fa is None and fb is None:
            return f"({FREE_DIGITS})" if need_one else f"({FREE_DIGITS})?"
        if fb == "":
            # the prefix equals the upper bound: any further digit would be a trailing zero
            return "[]" if need_one else '""'
        key = ("d", fa, fb, need_one)

        def body():
            alts = []
            if not need_one:
                # ending here: value so far equals prefix; ok for lower only if fa exhausted (None)
                if fa is None:
                    alts.append('""')
            lo_d = int(fa[0]) if fa is not None else 0
            if fb is None:
                hi_d = 9
            elif fb == "":
                hi_d = 0
            else:
                hi_d = int(fb[0])
            for d in range(lo_d, hi_d + 1):
                nfa = fa[1:] if (fa is not None and d == lo_d) else None
                if fb is None:
                    nfb = None
                elif fb == "":
                    nfb = ""
                else:
                    nfb = fb[1:] if d == hi_d else None
                # a fraction never ends in 0 (no trailing zeros): after a 0 another digit is needed
                alts.append(f'"{d}" ' + self.digits(nfa, nfb, d == 0))
            # group equal continuations for the free middle digits
            return " | ".join(alts) if alts else "[]"

        return self.rule(key, body)

    def fraction(self, fa, fb) -> str:
        """Optional fraction part ("." digits)? such that fa <= 0.F <= fb (strings, None = open)."""
        if (fa is None or fa == "") and fb is None:
            return f'("." {FREE_FRAC})?'
        alts = []
        if fa is None or fa == "":
            alts.append('""')
            alts.append('".0"')  # the value of the integer part itself, as json.dumps writes a float
        if fb != "":
            alts.append('"." ' + self.digits(fa if fa else None, fb, True))
        return "(" + " | ".join(alts) + ")"


def _nonneg_decimal(a: Decimal, b: Decimal | None, fb_: _FracBuilder) -> str:
    aI, aF = _split(a)
    if b is None:
        alts = [f'"{aI}" ' + fb_.fraction(aF, None), _nonneg_range(aI + 1, None) + f' ("." {FREE_FRAC})?']
        return "(" + " | ".join(alts) + ")"
    bI, bF = _split(b)
    if aI == bI:
        return f'"{aI}" ' + fb_.fraction(aF, bF)
    alts = [f'"{aI}" ' + fb_.fraction(aF, None)]
    if bI - aI >= 2:
        alts.append(_nonneg_range(aI + 1, bI - 1) + f' ("." {FREE_FRAC})?')
    alts.append(f'"{bI}" ' + fb_.fraction(None, bF))
    return "(" + " | ".join(alts) + ")"


def _round17(x: Decimal, up: bool) -> Decimal:
    if x == 0:
        return x
    with localcontext() as ctx:
        ctx.prec = 17
        ctx.rounding = ROUND_CEILING if up else ROUND_FLOOR
        return +x


def _unit17(x: Decimal) -> Decimal:
    t = x.as_tuple()
    return Decimal((0, (1,), x.adjusted() - 16))


class NumberBoundError(Exception):
    pass


def decimal_bounds(lo, lo_ex, hi, hi_ex) -> tuple[Decimal | None, Decimal | None]:
    """Decimal interval [L, U] whose every plain decimal text parses (binary64, or exactly as int)
    to a value inside the schema bounds. Raises NumberBoundError for unsupported bound values."""
    L = U = None
    with localcontext() as ctx:
        ctx.prec = 2000
        if lo is not None:
            if abs(lo) > SAFE or (isinstance(lo, float) and not math.isfinite(lo)):
                raise NumberBoundError("number bound magnitude above 2^53")
            m = float(lo)
            if lo_ex or (isinstance(lo, int) and m < lo):
                m = math.nextafter(m, math.inf)
            prev = math.nextafter(m, -math.inf)
            mid = (Decimal(prev) + Decimal(m)) / 2
            c = _round17(mid, up=True)
            if c <= mid:
                c += _unit17(c) if c != 0 else Decimal("1e-400")
            L = c
        if hi is not None:
            if abs(hi) > SAFE or (isinstance(hi, float) and not math.isfinite(hi)):
                raise NumberBoundError("number bound magnitude above 2^53")
            m = float(hi)
            if hi_ex or (isinstance(hi, int) and m > hi):
                m = math.nextafter(m, -math.inf)
            nxt = math.nextafter(m, math.inf)
            mid = (Decimal(nxt) + Decimal(m)) / 2
            c = _round17(mid, up=False)
            if c >= mid:
                c -= _unit17(c) if c != 0 else Decimal("1e-400")
            U = c
    return L, U


def decimal_range(lo, lo_ex, hi, hi_ex, rules: list, prefix: str) -> str:
    """EBNF expression for plain decimals (no exponent) whose parsed value satisfies the bounds."""
    L, U = decimal_bounds(lo, lo_ex, hi, hi_ex)
    import sys
    if sys.getrecursionlimit() < 20000:
        sys.setrecursionlimit(20000)
    if L is not None and U is not None and L > U:
        return "[]"
    fb_ = _FracBuilder(rules, prefix)
    alts = []
    # non-negative part
    if U is None or U >= 0:
        a = max(L, Decimal(0)) if L is not None else Decimal(0)
        alts.append(_nonneg_decimal(a, U, fb_))
    # negative part: "-" x with x in [max(0,-U), -L]
    if L is None or L < 0:
        a = max(-U, Decimal(0)) if U is not None else Decimal(0)
        b = -L if L is not None else None
        alts.append('"-" ' + _nonneg_decimal(a, b, fb_))
    if not alts:
        return "[]"
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
