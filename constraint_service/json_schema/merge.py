"""Normalisation and intersection (`allOf` / `$ref` merges) of IR nodes."""
from __future__ import annotations

import math

from .common import MAX_MERGES
from .ir import (ANY, Array, Boolean, Box, Const, Integer, NEVER, Node, Null, Number, Object, Ref, String,
                 Union, is_empty, resolve)
from .keys import undeclared_capacity


class MergeMixin:
    """Normalisation and intersection; methods of `reduce.Reducer` (state: Reducer.__init__)."""

    # ---- normalisation -----------------------------------------------------
    def is_never(self, n) -> bool:
        return is_empty(n)  # through finished references too (a property whose $ref is empty)

    def simplify_union(self, alts) -> Node:
        flat = []
        for a in alts:
            if isinstance(a, Union):
                flat.extend(a.alts)
            elif a is not NEVER:
                flat.append(a)
        if any(a is ANY for a in flat):
            return ANY
        if not flat:
            return NEVER
        if len(flat) == 1:
            return flat[0]
        return Union(flat)

    def norm_array(self, a: Array) -> Node:
        mx = a.max_items
        for i, p in enumerate(a.prefix):
            if self.is_never(p):
                if a.min_items > i:
                    return NEVER
                mx = i if mx is None else min(mx, i)
                break
        if self.is_never(a.items):
            lim = len(a.prefix)
            mx = lim if mx is None else min(mx, lim)
        if mx is not None and a.min_items > mx:
            return NEVER
        prefix = a.prefix if mx is None else a.prefix[:mx]
        return Array(list(prefix), a.items, a.min_items, mx)

    def norm_object(self, o: Object) -> Node:
        for name, n in o.props:
            if name in o.required and self.is_never(n):
                return NEVER
        if o.max_props is not None:
            if o.min_props > o.max_props or len(o.required) > o.max_props:
                return NEVER
        if o.min_props:
            declared = sum(1 for _, n in o.props if not self.is_never(n))
            if declared < o.min_props:
                if not o.patterns:
                    if self.is_never(o.additional):
                        return NEVER
                elif declared + undeclared_capacity(o, o.min_props - declared) < o.min_props:
                    return NEVER  # too few distinct keys possible (issue 13: no dead end, no repeated key)
        return o

    # ---- intersection ------------------------------------------------------
    def intersect(self, a: Node, b: Node, ptr: str) -> Node:
        if a is ANY:
            return b
        if b is ANY:
            return a
        if a is NEVER or b is NEVER:
            return NEVER
        self.merges += 1
        if self.merges > MAX_MERGES:
            self.unsupported(ptr, f"composition exceeds the limit of {MAX_MERGES} intersection merges")
        if isinstance(a, Ref) or isinstance(b, Ref):
            # keyed by the operands themselves (Box and nodes hash by identity and the memo keeps
            # them alive, so a key can never be reused by another object; issue 13)
            key = (a.box if isinstance(a, Ref) else a, b.box if isinstance(b, Ref) else b)
            if key in self.inter_memo:
                return self.inter_memo[key]
            ra, rb = resolve(a), resolve(b)
            if isinstance(ra, Ref) or isinstance(rb, Ref):
                self.unsupported(ptr, "reference cycle without a schema in between")
            box = Box(ptr)
            res = Ref(box)
            self.inter_memo[key] = res
            box.node = self.intersect(ra, rb, ptr)
            return res
        if isinstance(a, Union):
            return self.simplify_union([self.intersect(x, b, ptr) for x in a.alts])
        if isinstance(b, Union):
            return self.simplify_union([self.intersect(a, x, ptr) for x in b.alts])
        if isinstance(a, Const):
            kept = [v for v in a.values if self.accepts(b, v, 0)]
            return Const(kept, a.twins and self.twins_ok(kept, b)) if kept else NEVER
        if isinstance(b, Const):
            return self.intersect(b, a, ptr)
        ta, tb = type(a), type(b)
        if ta is Null and tb is Null or ta is Boolean and tb is Boolean:
            return a
        if {ta, tb} <= {Integer, Number}:
            if ta is Number and tb is Number:
                lo, lo_ex = a.lo, a.lo_ex
                if b.lo is not None and (lo is None or b.lo > lo or (b.lo == lo and b.lo_ex)):
                    lo, lo_ex = b.lo, b.lo_ex
                hi, hi_ex = a.hi, a.hi_ex
                if b.hi is not None and (hi is None or b.hi < hi or (b.hi == hi and b.hi_ex)):
                    hi, hi_ex = b.hi, b.hi_ex
                if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex))):
                    return NEVER
                return Number(lo, lo_ex, hi, hi_ex)
            i, n = (a, b) if ta is Integer else (b, a)
            lo, hi = i.lo, i.hi
            if isinstance(n, Integer):
                lo, hi = max(lo, n.lo), min(hi, n.hi)
            else:
                if n.lo is not None:
                    lo = max(lo, math.floor(n.lo) + 1 if n.lo_ex else math.ceil(n.lo))
                if n.hi is not None:
                    hi = min(hi, math.ceil(n.hi) - 1 if n.hi_ex else math.floor(n.hi))
            return Integer(lo, hi) if lo <= hi else NEVER
        if ta is String and tb is String:
            mn = max(a.min_len, b.min_len)
            mx = a.max_len if b.max_len is None else (b.max_len if a.max_len is None else min(a.max_len, b.max_len))
            if mx is not None and mn > mx:
                return NEVER
            return String(mn, mx, tuple(dict.fromkeys(a.patterns + b.patterns)),
                          tuple(dict.fromkeys(a.neg_patterns + b.neg_patterns)), a.where or b.where)
        if ta is Array and tb is Array:
            n = max(len(a.prefix), len(b.prefix))
            prefix = []
            for k in range(n):
                pa = a.prefix[k] if k < len(a.prefix) else a.items
                pb = b.prefix[k] if k < len(b.prefix) else b.items
                prefix.append(self.intersect(pa, pb, ptr))
            items = self.intersect(a.items, b.items, ptr)
            mn = max(a.min_items, b.min_items)
            mx = a.max_items if b.max_items is None else (b.max_items if a.max_items is None else min(a.max_items, b.max_items))
            return self.norm_array(Array(prefix, items, mn, mx))
        if ta is Object and tb is Object:
            pa_names = [p for p, _ in a.patterns]
            pb_names = [p for p, _ in b.patterns]
            if a.patterns and b.patterns and pa_names != pb_names:
                self.unsupported(ptr, "intersection of two objects with different patternProperties is not supported")
            for x, y in ((a, b), (b, a)):
                if x.patterns and not y.patterns and y.additional is not ANY:
                    self.unsupported(ptr, "patternProperties intersected with another object's "
                                          "additionalProperties is not supported")
            da, db = dict(a.props), dict(b.props)
            names = list(da) + [k for k in db if k not in da]
            props = []
            for k in names:
                pa = da[k] if k in da else self.prop_schema(a, k, ptr)
                pb = db[k] if k in db else self.prop_schema(b, k, ptr)
                props.append((k, self.intersect(pa, pb, ptr)))
            req = tuple(dict.fromkeys(a.required + b.required))
            add = self.intersect(a.additional, b.additional, ptr)
            if a.patterns and b.patterns:
                pats = [(p, self.intersect(x, y, ptr)) for (p, x), (_, y) in zip(a.patterns, b.patterns)]
                regions = [(i, self.intersect(x, y, ptr)) for (i, x), (_, y) in zip(a.regions, b.regions)]
            else:
                pats = list(a.patterns or b.patterns)
                regions = list(a.regions or b.regions)
            mxs = [m for m in (a.max_props, b.max_props) if m is not None]
            o = Object(props, req, add, pats, max(a.min_props, b.min_props), min(mxs) if mxs else None)
            o.regions = regions
            o.where = a.where if a.patterns else b.where
            o.props_where = a.props_where or b.props_where
            return self.norm_object(o)
        return NEVER
