"""`oneOf` and `if`/`then`/`else` by complements, `dependencies`, and `not` (issue 13): the
representable complements of IR nodes."""
from __future__ import annotations

from ..errors import ConstraintError
from .common import MAX_COMPLEMENT_DEPTH, MAX_DEPENDENCIES, _regex_literal, esc
from .ir import (ANY, Array, Boolean, Const, Integer, NEVER, Node, Null, Number, Object, Ref, String, Union,
                 json_equal, json_type, resolve)


class ComplementMixin:
    """Complements (`not`, `oneOf`, `if`) and `dependencies`; methods of `reduce.Reducer` (state:
    Reducer.__init__)."""

    # ---- oneOf and if/then/else by complements (issue 13) ------------------------------
    def oneof_exact(self, branches, parts, cp):
        """oneOf whose branches are not (yet) provably exclusive, exactly, as the union over i of
        branch i and the complement of every other branch, where those complements are representable.
        None when the branches are already provably exclusive or a complement is not representable
        (then the oneOf is checked for exclusivity after the reduction, as before)."""
        import itertools
        live = [i for i, p in enumerate(parts) if not self.is_never(p)]
        if len(live) < 2:
            return None
        try:
            if all(self.disjoint(parts[i], parts[j], 0) for i, j in itertools.combinations(live, 2)):
                return None
        except ConstraintError:
            return None
        saved = (self.never_reason, self.merges)
        try:
            comps = {j: self.complement(branches[j], f"{cp}/{j}") for j in live}
            out = []
            for i in live:
                n = parts[i]
                for j in live:
                    if j != i:
                        n = self.intersect(n, comps[j], f"{cp}/{i}")
                out.append(n)
            return self.simplify_union(out)
        except ConstraintError as e:
            if e.kind != "UnsupportedSchema":
                raise
            self.never_reason, self.merges = saved
            return None

    def conditional(self, s, ptr, node):
        """if/then/else (draft-07 and later): (if AND then) OR (NOT if AND else); `then` alone is
        NOT if OR then, `else` alone is if OR else (no complement needed)."""
        cond = self.translate(s["if"], ptr + "/if")
        then = self.translate(s["then"], ptr + "/then") if "then" in s else ANY
        els = self.translate(s["else"], ptr + "/else") if "else" in s else ANY
        if then is ANY and els is ANY:
            return node
        if then is ANY:
            return self.intersect(node, self.simplify_union([cond, els]), ptr + "/else")
        comp = self.complement(cond, ptr + "/if")
        if els is ANY:
            return self.intersect(node, self.simplify_union([comp, then]), ptr + "/then")
        yes = self.intersect(cond, then, ptr + "/then")
        no = self.intersect(comp, els, ptr + "/else")
        return self.intersect(node, self.simplify_union([yes, no]), ptr + "/if")

    # ---- dependencies (issue 13) --------------------------------------------------
    def dependencies(self, s, ptr, node):
        """dependencies / dependentRequired / dependentSchemas: for each trigger name, the instance is
        either an object without it, or an object with it (and the dependent names / schema); non-objects
        are unaffected. Exact, as a union of 2^k alternatives (k <= MAX_DEPENDENCIES)."""
        deps = []
        for kw in ("dependencies", "dependentRequired", "dependentSchemas"):
            if kw not in s:
                continue
            d = s[kw]
            kp = f"{ptr}/{kw}"
            if not isinstance(d, dict):
                self.invalid(kp, f"{kw} must be an object")
            for name, v in d.items():
                vp = f"{kp}/{esc(name)}"
                if isinstance(v, list) and kw != "dependentSchemas":
                    if not all(isinstance(x, str) for x in v):
                        self.invalid(vp, "dependent names must be strings")
                    deps.append((name, Object([(x, ANY) for x in dict.fromkeys(v)], tuple(dict.fromkeys(v)), ANY), vp))
                elif kw != "dependentRequired" and (isinstance(v, (dict, bool))):
                    deps.append((name, self.translate(v, vp), vp))
                else:
                    self.invalid(vp, f"{kw} values must be " + ("arrays of names" if kw == "dependentRequired" else "schemas"))
        if len(deps) > MAX_DEPENDENCIES:
            self.unsupported(deps[MAX_DEPENDENCIES][2], f"more than {MAX_DEPENDENCIES} dependencies are not supported")
        others = [Null(), Boolean(), Number(), String(), Array()]
        for name, then, vp in deps:
            absent = Union(others + [Object([(name, NEVER)], (), ANY)])
            present = self.intersect(Object([(name, ANY)], (name,), ANY), then, vp)
            node = self.simplify_union([self.intersect(node, absent, vp), self.intersect(node, present, vp)])
        return node

    # ---- not (issue 13) -------------------------------------------------------------
    def complement(self, n, ptr) -> Node:
        """The complement of a reduced schema where it is representable: types, const/enum values,
        number ranges, string lengths and patterns, required names. UnsupportedSchema at `ptr` elsewhere."""
        n = resolve(n)
        if n is ANY:
            return NEVER
        if n is NEVER:
            return ANY
        if isinstance(n, Ref):
            self.unsupported(ptr, "not over a recursive reference is not supported")
        alts = []
        stack = [n]
        while stack:  # nested unions (anyOf inside anyOf, references to unions) flattened
            a = resolve(stack.pop())
            if isinstance(a, Union):
                if len(alts) + len(stack) > 4096:
                    self.unsupported(ptr, "not over a union of more than 4096 schemas is not supported")
                stack.extend(reversed(a.alts))
            else:
                alts.append(a)
        by = {t: [] for t in ("null", "boolean", "number", "string", "array", "object")}
        for a in alts:
            if a is NEVER:
                continue
            if a is ANY:
                return NEVER
            if isinstance(a, Ref) or isinstance(a, Union):
                self.unsupported(ptr, "not over a recursive reference is not supported")
            if isinstance(a, Const):
                for v in a.values:
                    t = json_type(v)
                    by["number" if t == "integer" else t].append(Const([v]))
                continue
            t = {Null: "null", Boolean: "boolean", Integer: "number", Number: "number", String: "string",
                 Array: "array", Object: "object"}[type(a)]
            by[t].append(a)
        out = []
        for t, parts in by.items():
            if not parts:
                out.append({"null": Null, "boolean": Boolean, "number": Number, "string": String,
                            "array": Array, "object": Object}[t]())
                continue
            c = self._complement_in_type(t, parts, ptr)
            if c is not None:
                out.extend(c)
        return self.simplify_union(out)

    def _complement_in_type(self, t, parts, ptr):
        """List of nodes covering the values of JSON type t outside every node of `parts` (all of
        type t), or [] when parts cover the whole type."""
        consts = [p.values[0] for p in parts if isinstance(p, Const)]
        others = [p for p in parts if not isinstance(p, Const)]
        if any(self._whole_type(p) for p in others):
            return []  # one part covers the whole type (e.g. a branch without assertions on it)
        if t == "null":
            return []
        if t == "boolean":
            if others:
                return []
            left = [b for b in (True, False) if not any(json_equal(b, c) for c in consts)]
            return [Const(left)] if left else []
        if t == "number":
            if any(isinstance(p, Integer) for p in others):
                self.unsupported(ptr, "not over integer ranges (non-integer numbers) is not supported")
            if len(others) > 1 or (others and consts):
                self.unsupported(ptr, "not over a union of number ranges is not supported")
            if others:
                p = others[0]
                res = []
                if p.lo is not None:
                    res.append(Number(None, False, p.lo, not p.lo_ex))
                if p.hi is not None:
                    res.append(Number(p.hi, not p.hi_ex, None, False))
                return res
            pts = sorted(set(float(c) if isinstance(c, float) else c for c in consts))
            res = []
            prev = None
            for v in pts:
                res.append(Number(prev, prev is not None, v, True))
                prev = v
            res.append(Number(prev, True, None, False))
            return res
        if t == "string":
            if others and consts:
                self.unsupported(ptr, "not over strings and string values together is not supported")
            if consts:
                neg = tuple("^" + _regex_literal(c) + "$" for c in consts)
                return [String(0, None, (), neg, ptr)]
            if len(others) > 1:
                self.unsupported(ptr, "not over a union of string constraints is not supported")
            p = others[0]
            if p.neg_patterns:
                self.unsupported(ptr, "double negation of string patterns is not supported")
            has_len = p.min_len > 0 or p.max_len is not None
            if has_len and p.patterns:
                self.unsupported(ptr, "not over string length and pattern together is not supported")
            if p.patterns:
                if len(p.patterns) > 1:
                    self.unsupported(ptr, "not over several string patterns is not supported")
                return [String(0, None, (), p.patterns, ptr)]
            res = []
            if p.min_len > 0:
                res.append(String(0, p.min_len - 1, (), (), ptr))
            if p.max_len is not None:
                res.append(String(p.max_len + 1, None, (), (), ptr))
            return res
        if t == "array":
            if consts or len(others) != 1:
                self.unsupported(ptr, "not over array values is not supported")
            p = others[0]
            if p.prefix or p.items is not ANY or p.min_items or p.max_items is not None:
                self.unsupported(ptr, "not over array constraints is not supported")
            return []
        if t == "object":
            if consts:
                self.unsupported(ptr, "not over object values is not supported")
            # NOT (A OR B) = NOT A AND NOT B
            res = self.simplify_union(self._object_complement(others[0], ptr))
            for p in others[1:]:
                res = self.intersect(res, self.simplify_union(self._object_complement(p, ptr)), ptr)
            return [] if self.is_never(res) else [res]
        raise AssertionError(t)

    @staticmethod
    def _whole_type(p) -> bool:
        """True when node p admits every value of its JSON type."""
        if isinstance(p, (Null, Boolean)):
            return True
        if isinstance(p, Number):
            return p.lo is None and p.hi is None
        if isinstance(p, String):
            return not p.min_len and p.max_len is None and not p.patterns and not p.neg_patterns
        if isinstance(p, Array):
            return not p.prefix and p.items is ANY and not p.min_items and p.max_items is None
        if isinstance(p, Object):
            return (p.additional is ANY and not p.patterns and not p.required and not p.min_props
                    and p.max_props is None and all(resolve(v) is ANY for _, v in p.props))
        return False

    def _object_complement(self, p: Object, ptr) -> list:
        """Objects that fail `p`: a required name missing, a declared property present with a value
        outside its schema, too few / too many members. Exact; UnsupportedSchema for patternProperties
        and additionalProperties (an undeclared member outside a schema is not representable)."""
        if p.additional is not ANY or p.patterns:
            self.unsupported(ptr, "not over patternProperties / additionalProperties is not supported")
        res = [Object([(r, NEVER)], (), ANY) for r in p.required]
        if p.min_props:
            res.append(Object([], (), ANY, [], 0, p.min_props - 1))
        if p.max_props is not None:
            res.append(Object([], (), ANY, [], p.max_props + 1, None))
        if any(resolve(v) is not ANY for _, v in p.props):
            if self.comp_depth >= MAX_COMPLEMENT_DEPTH:
                self.unsupported(ptr, f"not over objects nested deeper than {MAX_COMPLEMENT_DEPTH} is not supported")
            self.comp_depth += 1
            try:
                for name, v in p.props:
                    if resolve(v) is ANY:
                        continue
                    c = self.complement(v, ptr)
                    if not self.is_never(c):
                        res.append(Object([(name, c)], (name,), ANY))
            finally:
                self.comp_depth -= 1
        return res
