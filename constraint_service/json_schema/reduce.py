"""Source-schema validation and reduction of compositions to the IR graph."""
from __future__ import annotations

import math

from ..errors import ConstraintError
from ..regex import parse_regex, regex_search
from .ir import (ANY, NEVER, Array, Boolean, Box, Const, Integer, Node, Null, Number, Object, Ref,
                 String, Union, json_equal, json_type, resolve)
from .numbers import INT64_MAX, INT64_MIN

MAX_MERGES = 16_384
MAX_VALUE_DEPTH = 256

ANNOTATIONS = {
    "title", "description", "default", "examples", "example", "$comment", "readOnly", "writeOnly",
    "deprecated", "contentMediaType", "contentEncoding", "markdownDescription", "deprecationMessage",
    "errorMessage", "enumDescriptions", "markdownEnumDescriptions", "defaultSnippets", "doNotSuggest",
    "suggestSortText", "patternErrorMessage", "allowTrailingCommas", "propertyOrder", "headerTemplate",
    "options", "javaType", "javaInterfaces", "tsType", "$anchor", "discriminator", "externalDocs", "xml",
}
CONTAINERS = {"$defs", "definitions"}
IDENTITY = {"$schema", "$id", "id", "$vocabulary"}
UNSUPPORTED = {
    "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems",
    "contains", "minContains", "maxContains", "multipleOf", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems", "format", "not",
    "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor",
}
TYPE_KW = {
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "string": {"minLength", "maxLength", "pattern"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties"},
}
ASSERTIONS = set().union(*TYPE_KW.values()) | {"type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref"}
ALL_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def esc(tok: str) -> str:
    return tok.replace("~", "~0").replace("/", "~1")


def unesc(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


class Reducer:
    def __init__(self, root, draft7: bool, draft4: bool = False, unknown_keywords: str = "reject"):
        self.root = root
        self.unknown_keywords = unknown_keywords
        self.draft7 = draft7
        self.draft4 = draft4
        self.boxes: dict[str, Box] = {}
        self.merges = 0
        self.inter_memo: dict = {}
        self.anchors: dict[str, str] = {}
        self.pending_oneof: list = []

    def check_oneof(self):
        """Every oneOf must have pairwise provably exclusive branches (else UnsupportedSchema at it)."""
        for cp, live in sorted(self.pending_oneof, key=lambda x: x[0]):
            for i in range(len(live)):
                for j in range(i + 1, len(live)):
                    if not self.disjoint(live[i], live[j], 0):
                        self.unsupported(cp, "oneOf branches are not provably exclusive")
        self.pending_oneof = []

    # ---- errors --------------------------------------------------------
    def unsupported(self, ptr, msg):
        raise ConstraintError("UnsupportedSchema", msg, ptr)

    def invalid(self, ptr, msg):
        raise ConstraintError("InvalidSchema", msg, ptr)

    # ---- refs ------------------------------------------------------------
    def lookup(self, ref: str, ptr: str):
        if ref == "#" or ref == "":
            return self.root, ""
        if ref.startswith("#/"):
            cur = self.root
            path = ""
            for raw in ref[2:].split("/"):
                tok = unesc(raw.replace("%25", "%").replace("%22", '"'))
                if isinstance(cur, dict) and tok in cur:
                    cur = cur[tok]
                elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
                    cur = cur[int(tok)]
                else:
                    self.invalid(ptr, f"unresolvable $ref {ref!r}")
                path += "/" + esc(tok)
            return cur, path
        if ref.startswith("#"):
            name = ref[1:]
            if name in self.anchors:
                p = self.anchors[name]
                return self.lookup("#" + p if p else "#", ptr)
        self.unsupported(ptr, f"external or non-local $ref {ref!r} is not supported")

    def ref_node(self, ref: str, ptr: str) -> Node:
        target, path = self.lookup(ref, ptr)
        box = self.boxes.get(path)
        if box is None:
            box = Box(path)
            self.boxes[path] = box
            box.building = True
            box.node = None
            box.node = self.translate(target, path)
            box.building = False
        return Ref(box)

    # ---- translation -------------------------------------------------------
    def translate(self, s, ptr: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            return NEVER
        if not isinstance(s, dict):
            self.invalid(ptr, "a schema must be an object or a boolean")
        # keyword check, in source order
        for k in s:
            kp = f"{ptr}/{esc(k)}"
            if k in ("contentMediaType", "contentEncoding") and self.draft7:
                # draft-07 lets validators assert these (optional vocabulary): not enforced here
                self.unsupported(kp, f"draft-07 {k} may be an assertion; not supported")
            if k in ASSERTIONS or k in ANNOTATIONS or k in CONTAINERS:
                continue
            if k.startswith("x-"):
                continue
            if k in IDENTITY:
                if k == "$schema" or k == "$vocabulary":
                    continue
                if k == "id" and not self.draft4:
                    self.unsupported(kp, "unknown keyword 'id'")
                if ptr != "":
                    self.unsupported(kp, f"nested {k} is not supported")
                continue
            if k in UNSUPPORTED:
                self.unsupported(kp, f"keyword {k!r} is not supported")
            if k == "$ref":
                continue
            if self.unknown_keywords == "annotate" and not k.startswith("$"):
                continue  # opt-in: unknown keywords treated as annotations (2020-12 section 4.3.1)
            self.unsupported(kp, f"unknown keyword {k!r}")
        if "$ref" in s and self.draft7:
            for k in s:
                if k in ASSERTIONS and k != "$ref":
                    self.unsupported(f"{ptr}/{esc(k)}", "draft-07 ignores $ref siblings; use allOf")

        node = self.translate_local(s, ptr)
        if "$ref" in s:
            if not isinstance(s["$ref"], str):
                self.invalid(ptr + "/$ref", "$ref must be a string")
            node = self.intersect(node, self.ref_node(s["$ref"], ptr + "/$ref"), ptr + "/$ref")
        for comb in ("allOf", "anyOf", "oneOf"):
            if comb not in s:
                continue
            subs = s[comb]
            cp = f"{ptr}/{comb}"
            if not isinstance(subs, list) or not subs:
                self.invalid(cp, f"{comb} must be a non-empty array")
            branches = [self.translate(b, f"{cp}/{i}") for i, b in enumerate(subs)]
            if comb == "allOf":
                for i, b in enumerate(branches):
                    node = self.intersect(node, b, f"{cp}/{i}")
            elif comb == "anyOf":
                node = self.intersect(node, Union(branches), cp)
            else:
                parts = [self.intersect(node, b, f"{cp}/{i}") for i, b in enumerate(branches)]
                live = [p for p in parts if not self.is_never(p)]
                # proven after the whole document is reduced, when every referenced definition
                # (including ones still being built here, under recursion) is complete
                self.pending_oneof.append((cp, live))
                node = self.simplify_union(live)
        return node

    def _num(self, s, k, ptr):
        v = s[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.invalid(f"{ptr}/{esc(k)}", f"{k} must be a number")
        if isinstance(v, float) and not math.isfinite(v):
            self.unsupported(f"{ptr}/{esc(k)}", f"{k} is not a finite binary64 value")
        return v

    def _nonneg_int(self, s, k, ptr):
        v = s[k]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            self.invalid(f"{ptr}/{esc(k)}", f"{k} must be a non-negative integer")
        return v

    def translate_local(self, s, ptr) -> Node:
        types = s.get("type")
        if types is None:
            tlist = list(ALL_TYPES)
            explicit = False
        else:
            tl = types if isinstance(types, list) else [types]
            for t in tl:
                if t not in ALL_TYPES:
                    self.invalid(ptr + "/type", f"unknown type {t!r}")
            tlist = list(dict.fromkeys(tl))
            explicit = True
        present = {t for t, kws in TYPE_KW.items() if any(k in s for k in kws)}
        alts = []
        for t in tlist:
            if t == "integer" and "number" in tlist and not explicit:
                continue  # number covers integers
            alts.append(self.typed(t, s, ptr))
        if not explicit and not present:
            node = ANY
        else:
            node = self.simplify_union([a for a in alts if a is not NEVER])
        if "const" in s or "enum" in s:
            if "enum" in s:
                vals = s["enum"]
                if not isinstance(vals, list):
                    self.invalid(ptr + "/enum", "enum must be an array")
            else:
                vals = [s["const"]]
            if "const" in s and "enum" in s:
                vals = [v for v in s["enum"] if json_equal(v, s["const"])]
            where = ptr + ("/enum" if "enum" in s else "/const")
            for v in vals:
                self.check_value(v, where, 0)
            kept = []
            for v in vals:
                if self.accepts(node, v, 0) and not any(json_equal(v, k) for k in kept):
                    kept.append(v)
            if not kept:
                raise ConstraintError("UnsatisfiableSchema", "no enum/const value satisfies the sibling assertions", where)
            node = Const(kept)
        return node

    def check_value(self, v, ptr, depth):
        if depth > MAX_VALUE_DEPTH:
            self.unsupported(ptr, f"finite value nesting exceeds the recursion depth limit {MAX_VALUE_DEPTH}")
        if isinstance(v, float) and not math.isfinite(v):
            self.unsupported(ptr, "non-finite number")
        if isinstance(v, int) and not isinstance(v, bool) and not (INT64_MIN <= v <= INT64_MAX):
            self.unsupported(ptr, "integer literal outside signed 64-bit")
        if isinstance(v, list):
            for x in v:
                self.check_value(x, ptr, depth + 1)
        elif isinstance(v, dict):
            for x in v.values():
                self.check_value(x, ptr, depth + 1)

    def typed(self, t, s, ptr) -> Node:
        if t == "null":
            return Null()
        if t == "boolean":
            return Boolean()
        if t in ("integer", "number"):
            lo = hi = None
            lo_ex = hi_ex = False
            if "minimum" in s:
                lo = self._num(s, "minimum", ptr)
            if "maximum" in s:
                hi = self._num(s, "maximum", ptr)
            for k, is_lo in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
                if k not in s:
                    continue
                v = s[k]
                if isinstance(v, bool):
                    if not self.draft4:
                        self.invalid(f"{ptr}/{k}", f"{k} must be a number")
                    if v:
                        if is_lo:
                            lo_ex = True
                        else:
                            hi_ex = True
                    continue
                v = self._num(s, k, ptr)
                if is_lo:
                    if lo is None or v >= lo:
                        lo, lo_ex = v, True
                else:
                    if hi is None or v <= hi:
                        hi, hi_ex = v, True
            if t == "integer":
                ilo = None if lo is None else (math.floor(lo) + 1 if lo_ex else math.ceil(lo))
                ihi = None if hi is None else (math.ceil(hi) - 1 if hi_ex else math.floor(hi))
                ilo = INT64_MIN if ilo is None else max(ilo, INT64_MIN)
                ihi = INT64_MAX if ihi is None else min(ihi, INT64_MAX)
                if ilo > ihi:
                    return NEVER
                return Integer(ilo, ihi)
            if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex))):
                return NEVER
            return Number(lo, lo_ex, hi, hi_ex)
        if t == "string":
            mn = self._nonneg_int(s, "minLength", ptr) if "minLength" in s else 0
            mx = self._nonneg_int(s, "maxLength", ptr) if "maxLength" in s else None
            pats = ()
            if "pattern" in s:
                p = s["pattern"]
                if not isinstance(p, str):
                    self.invalid(ptr + "/pattern", "pattern must be a string")
                try:
                    parse_regex(p, "UnsupportedSchema")
                except ConstraintError as e:
                    raise ConstraintError("UnsupportedSchema", f"pattern: {e.message}", ptr + "/pattern")
                pats = (p,)
            if mx is not None and mn > mx:
                return NEVER
            return String(mn, mx, pats)
        if t == "array":
            prefix = []
            items = ANY
            if "prefixItems" in s and not self.draft7:
                pi = s["prefixItems"]
                if not isinstance(pi, list):
                    self.invalid(ptr + "/prefixItems", "prefixItems must be an array")
                prefix = [self.translate(x, f"{ptr}/prefixItems/{i}") for i, x in enumerate(pi)]
            elif "prefixItems" in s:
                self.unsupported(ptr + "/prefixItems", "prefixItems is not a draft-07 keyword")
            if "items" in s:
                it = s["items"]
                if isinstance(it, list):
                    if not self.draft7:
                        self.invalid(ptr + "/items", "items must be a schema in 2020-12 (use prefixItems)")
                    prefix = [self.translate(x, f"{ptr}/items/{i}") for i, x in enumerate(it)]
                    if "additionalItems" in s:
                        items = self.translate(s["additionalItems"], ptr + "/additionalItems")
                else:
                    items = self.translate(it, ptr + "/items")
            if "additionalItems" in s and not (self.draft7 and isinstance(s.get("items"), list)):
                if not self.draft7:
                    self.unsupported(ptr + "/additionalItems", "additionalItems is not a 2020-12 keyword")
                # draft-07: additionalItems without an items array has no effect
            mn = self._nonneg_int(s, "minItems", ptr) if "minItems" in s else 0
            mx = self._nonneg_int(s, "maxItems", ptr) if "maxItems" in s else None
            return self.norm_array(Array(prefix, items, mn, mx))
        if t == "object":
            props = []
            if "properties" in s:
                ps = s["properties"]
                if not isinstance(ps, dict):
                    self.invalid(ptr + "/properties", "properties must be an object")
                props = [(k, self.translate(v, f"{ptr}/properties/{esc(k)}")) for k, v in ps.items()]
            req = ()
            if "required" in s:
                r = s["required"]
                if not isinstance(r, list) or not all(isinstance(x, str) for x in r):
                    self.invalid(ptr + "/required", "required must be an array of strings")
                req = tuple(dict.fromkeys(r))
            add = ANY
            if "additionalProperties" in s:
                add = self.translate(s["additionalProperties"], ptr + "/additionalProperties")
            names = {k for k, _ in props}
            for r in req:
                if r not in names:
                    props.append((r, add))
            o = self.norm_object(Object(props, req, add))
            if o is NEVER and "required" in s:
                raise ConstraintError("UnsatisfiableSchema", "a required property can never appear", ptr + "/required")
            return o
        raise AssertionError(t)

    # ---- normalisation -----------------------------------------------------
    def is_never(self, n) -> bool:
        return n is NEVER or (isinstance(n, Union) and not n.alts)

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
            return Const(kept) if kept else NEVER
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
            return String(mn, mx, tuple(dict.fromkeys(a.patterns + b.patterns)))
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
            da, db = dict(a.props), dict(b.props)
            names = list(da) + [k for k in db if k not in da]
            props = []
            for k in names:
                pa = da.get(k, a.additional)
                pb = db.get(k, b.additional)
                props.append((k, self.intersect(pa, pb, ptr)))
            req = tuple(dict.fromkeys(a.required + b.required))
            add = self.intersect(a.additional, b.additional, ptr)
            return self.norm_object(Object(props, req, add))
        return NEVER

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
            return jt == "integer" and n.lo <= v <= n.hi
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
            return all(regex_search(p, v) for p in n.patterns)
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
            d = dict(n.props)
            for r in n.required:
                if r not in v:
                    return False
            for k, x in v.items():
                if not self.accepts(d.get(k, n.additional), x, depth + 1):
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
            da, db = dict(ra.props), dict(rb.props)
            for k in set(ra.required) & set(rb.required):
                if self.disjoint(da.get(k, ra.additional), db.get(k, rb.additional), depth + 1):
                    return True
            # a property required by one side that the other forbids
            for x, y, dx in ((ra, rb, db), (rb, ra, da)):
                for k in x.required:
                    if self.is_never(dx.get(k, y.additional)):
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
