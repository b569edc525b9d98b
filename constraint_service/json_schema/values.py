"""Finite value checks (enum / const filtering) and `oneOf` exclusivity (types, numeric intervals,
string languages)."""
from __future__ import annotations

import math

from ..errors import ConstraintError
from ..regex import parse_regex, regex_search
from .common import ALL_TYPES, MAX_VALUE_DEPTH
from .ir import (ANY, Array, Boolean, Const, Integer, NEVER, Node, Null, Number, Object, Ref, String, Union,
                 json_equal, json_type, resolve)


class ValuesMixin:
    """Finite value checks and `oneOf` exclusivity; methods of `reduce.Reducer` (state:
    Reducer.__init__)."""

    # ---- value check (enum/const filtering) ----------------------------------
    def accepts(self, n: Node, v, depth: int) -> bool:
        if depth > MAX_VALUE_DEPTH:
            self.unsupported("", f"finite value check exceeds the recursion depth limit {MAX_VALUE_DEPTH}")
        n = resolve(n)
        if n is ANY:
            return True
        if n is NEVER:
            return False
        if isinstance(n, Ref):
            self.unsupported(n.box.pointer, "enum/const filtered through an unfinished recursive reference")
        if isinstance(n, Union):
            return any(self.accepts(x, v, depth) for x in n.alts)
        if isinstance(n, Const):
            return any(json_equal(v, x) for x in n.values)
        jt = json_type(v)
        if isinstance(n, Null):
            return jt == "null"
        if isinstance(n, Boolean):
            return jt == "boolean"
        if isinstance(n, Integer):
            # draft-04 `integer` excludes numbers written with a fraction (1.0), as `jsonschema` does
            return jt == "integer" and n.lo <= v <= n.hi and not (self.draft4 and isinstance(v, float))
        if isinstance(n, Number):
            if jt not in ("integer", "number"):
                return False
            if n.lo is not None and (v <= n.lo if n.lo_ex else v < n.lo):
                return False
            if n.hi is not None and (v >= n.hi if n.hi_ex else v > n.hi):
                return False
            return True
        if isinstance(n, String):
            if jt != "string":
                return False
            ln = len(v)
            if ln < n.min_len or (n.max_len is not None and ln > n.max_len):
                return False
            return (all(regex_search(p, v) for p in n.patterns)
                    and not any(regex_search(p, v) for p in n.neg_patterns))
        if isinstance(n, Array):
            if jt != "array":
                return False
            if len(v) < n.min_items or (n.max_items is not None and len(v) > n.max_items):
                return False
            for k, x in enumerate(v):
                sub = n.prefix[k] if k < len(n.prefix) else n.items
                if not self.accepts(sub, x, depth + 1):
                    return False
            return True
        if isinstance(n, Object):
            if jt != "object":
                return False
            for r in n.required:
                if r not in v:
                    return False
            if len(v) < n.min_props or (n.max_props is not None and len(v) > n.max_props):
                return False
            for k, x in v.items():
                if not self.accepts(self.prop_schema(n, k), x, depth + 1):
                    return False
            return True
        return False

    # ---- oneOf exclusivity ---------------------------------------------------
    def types_of(self, n, depth=0) -> set:
        n = resolve(n)
        if n is ANY or isinstance(n, Ref) or depth > 50:
            return set(ALL_TYPES)
        if n is NEVER:
            return set()
        if isinstance(n, Union):
            return set().union(*(self.types_of(x, depth + 1) for x in n.alts))
        if isinstance(n, Const):
            out = set()
            for v in n.values:
                t = json_type(v)
                out.add("number" if t == "integer" else t)
            return out
        m = {Null: "null", Boolean: "boolean", Integer: "number", Number: "number", String: "string",
             Array: "array", Object: "object"}
        return {m[type(n)]}

    def disjoint(self, a, b, depth) -> bool:
        if depth > 20:
            return False
        ra, rb = resolve(a), resolve(b)
        if not (self.types_of(ra) & self.types_of(rb)):
            return True
        if isinstance(ra, Union):
            return all(self.disjoint(x, rb, depth + 1) for x in ra.alts)
        if isinstance(rb, Union):
            return all(self.disjoint(ra, x, depth + 1) for x in rb.alts)
        if isinstance(ra, Const):
            return not any(self.accepts(rb, v, 0) for v in ra.values)
        if isinstance(rb, Const):
            return not any(self.accepts(ra, v, 0) for v in rb.values)
        if isinstance(ra, (Integer, Number)) and isinstance(rb, (Integer, Number)):
            return self.intervals_disjoint(ra, rb)
        if isinstance(ra, String) and isinstance(rb, String):
            return self.strings_disjoint(ra, rb)
        if isinstance(ra, Array) and isinstance(rb, Array):
            amax = math.inf if ra.max_items is None else ra.max_items
            bmax = math.inf if rb.max_items is None else rb.max_items
            if amax < rb.min_items or bmax < ra.min_items:
                return True  # length ranges do not meet
            for k in range(min(ra.min_items, rb.min_items)):  # a position both must have
                pa = ra.prefix[k] if k < len(ra.prefix) else ra.items
                pb = rb.prefix[k] if k < len(rb.prefix) else rb.items
                if self.disjoint(pa, pb, depth + 1):
                    return True
            return False
        if isinstance(ra, Object) and isinstance(rb, Object):
            for k in sorted(set(ra.required) & set(rb.required)):
                if self.disjoint(self.prop_schema(ra, k), self.prop_schema(rb, k), depth + 1):
                    return True
            # a property required by one side that the other forbids
            for x, y in ((ra, rb), (rb, ra)):
                for k in x.required:
                    if self.is_never(self.prop_schema(y, k)):
                        return True
            return False
        return False

    @staticmethod
    def _interval(n):
        if isinstance(n, Integer):
            return n.lo, False, n.hi, False
        return n.lo, n.lo_ex, n.hi, n.hi_ex

    def intervals_disjoint(self, a, b) -> bool:
        """Numeric ranges that cannot share a value (integers are numbers: integer is a subdomain)."""
        alo, alo_ex, ahi, ahi_ex = self._interval(a)
        blo, blo_ex, bhi, bhi_ex = self._interval(b)

        def below(hi, hi_ex, lo, lo_ex):  # every value <= hi is < every value >= lo
            if hi is None or lo is None:
                return False
            return hi < lo or (hi == lo and (hi_ex or lo_ex))
        return below(ahi, ahi_ex, blo, blo_ex) or below(bhi, bhi_ex, alo, alo_ex)

    def strings_disjoint(self, a, b) -> bool:
        """No string satisfies both (length ranges, then the product automaton of all patterns)."""
        mn = max(a.min_len, b.min_len)
        mxs = [m for m in (a.max_len, b.max_len) if m is not None]
        mx = min(mxs) if mxs else None
        if mx is not None and mn > mx:
            return True
        pats = tuple(dict.fromkeys(a.patterns + b.patterns))
        if not pats:
            return False
        from ..regex import AutomatonLimit, build_nfa, parse_regex, product_dfa, search_ast
        try:
            nfas = [build_nfa(search_ast(parse_regex(p, "UnsupportedSchema"))) for p in pats]
            dfa = product_dfa(nfas, mn, mx, 4_096, 8_192)
        except (AutomatonLimit, ConstraintError):
            return False  # not provable within the proof budget
        return not dfa.accept
