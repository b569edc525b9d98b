"""Source-schema validation and reduction of compositions to the IR graph.

The Reducer is split by concern: translation of schema objects (here), identifiers and `$ref`
(refs.py), complements for `not` / `oneOf` / `if` and `dependencies` (complements.py), normalisation and
intersection (merge.py), finite value checks and `oneOf` exclusivity (values.py); shared constants in
common.py."""
from __future__ import annotations

import math

from ..errors import ConstraintError
from ..regex import parse_regex, regex_search
from .ir import (ANY, NEVER, Array, Boolean, Box, Const, Integer, Node, Null, Number, Object, Ref,
                 String, Union, json_equal, json_key, resolve)
from .formats import INTEGER_FORMATS, MAX_LENGTH, STRING_FORMATS, format_pattern
from .numbers import INT64_MAX, INT64_MIN
from .common import ALL_TYPES, MAX_VALUE_DEPTH, esc
from .complements import ComplementMixin
from .merge import MergeMixin
from .refs import RefsMixin
from .values import ValuesMixin

MAX_UNIQUE_ARRAYS = 4_096  # uniqueItems over a finite item domain: arrays enumerated
MAX_MULTIPLES = 4_096      # multipleOf on integers: multiples enumerated within the bounds
MAX_PATTERN_PROPERTIES = 4  # undeclared keys split into 2^k - 1 pattern classes


ANNOTATIONS = {
    "title", "description", "default", "examples", "example", "$comment", "readOnly", "writeOnly",
    "deprecated", "contentMediaType", "contentEncoding", "contentSchema", "markdownDescription",
    "deprecationMessage", "errorMessage", "enumDescriptions", "markdownEnumDescriptions", "defaultSnippets",
    "doNotSuggest", "suggestSortText", "patternErrorMessage", "allowTrailingCommas", "propertyOrder",
    "headerTemplate", "options", "javaType", "javaInterfaces", "tsType", "$anchor", "discriminator",
    "externalDocs", "xml",
}
CONTAINERS = {"$defs", "definitions"}
IDENTITY = {"$schema", "$id", "id", "$vocabulary"}
# assertions (in some draft) that the contract cannot enforce exactly: located rejections
UNSUPPORTED = {
    "contains", "minContains", "maxContains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor",
}
TYPE_KW = {
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "string": {"minLength", "maxLength", "pattern"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "patternProperties", "minProperties",
               "maxProperties", "dependencies", "dependentRequired", "dependentSchemas"},
}
ASSERTIONS = set().union(*TYPE_KW.values()) | {"type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref", "not",
                                               "format", "if", "then", "else"}
# dialects (issue 13): $schema URI fragment -> name; `legacy` drafts (4, 6, 7) take `items` arrays with
# `additionalItems` and ignore the siblings of `$ref`
DIALECTS = (("json-schema.org/draft-04/schema", "draft4"), ("json-schema.org/draft-06/schema", "draft6"),
            ("json-schema.org/draft-07/schema", "draft7"), ("json-schema.org/draft/2019-09/schema", "2019-09"),
            ("json-schema.org/draft/2020-12/schema", "2020-12"))








class Reducer(RefsMixin, ComplementMixin, MergeMixin, ValuesMixin):
    def __init__(self, root, draft7: bool, draft4: bool = False, unknown_keywords: str = "annotate",
                 dialect: str | None = None):
        self.root = root
        self.unknown_keywords = unknown_keywords
        if dialect is None:
            dialect = "draft4" if draft4 else ("draft7" if draft7 else "2020-12")
        self.dialect = dialect
        self.draft4 = dialect == "draft4"
        # draft7: the legacy array/`$ref` semantics of drafts 4, 6 and 7
        self.draft7 = dialect in ("draft4", "draft6", "draft7")
        self.items_array = dialect in ("draft4", "draft6", "draft7", "2019-09")
        self.id_keyword = "id" if self.draft4 else "$id"
        # identifiers (issue 13): base URI of every schema object holding $id/id, resources by URI,
        # anchors by (resource URI, name); filled by index_ids()
        self.bases: dict[str, str] = {}
        self.resources: dict[str, str] = {}
        self.named_anchors: dict[tuple, str] = {}
        self.never_reason: tuple | None = None
        self.boxes: dict[str, Box] = {}
        self.merges = 0
        self.inter_memo: dict = {}
        self.anchors: dict[str, str] = {}
        self.pending_oneof: list = []
        self.comp_depth = 0

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

    # ---- translation -------------------------------------------------------
    def translate(self, s, ptr: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            return NEVER
        if not isinstance(s, dict):
            self.invalid(ptr, "a schema must be an object or a boolean")
        # keyword check, in source order
        legacy_ref = "$ref" in s and self.draft7
        for k in s:
            kp = f"{ptr}/{esc(k)}"
            if legacy_ref and k != "$ref":
                continue  # drafts 4-7: the siblings of $ref are ignored (draft-07 core 8.3)
            if k in ("contentMediaType", "contentEncoding") and self.draft7:
                # draft-07 lets validators assert these (optional vocabulary): not enforced here
                self.unsupported(kp, f"draft-07 {k} may be an assertion; not supported")
            if k in ASSERTIONS or k in ANNOTATIONS or k in CONTAINERS or k in IDENTITY:
                continue
            if k in UNSUPPORTED:
                self.unsupported(kp, f"keyword {k!r} is not supported")
            if self.unknown_keywords == "reject" and not k.startswith("x-"):
                self.unsupported(kp, f"unknown keyword {k!r}")
            # unknown keywords are annotations (2020-12 core 4.3.1; earlier drafts likewise ignore them)
        if legacy_ref:
            if not isinstance(s["$ref"], str):
                self.invalid(ptr + "/$ref", "$ref must be a string")
            return self.ref_node(s["$ref"], ptr + "/$ref")

        if "format" in s:
            f = s["format"]
            if not isinstance(f, str):
                self.invalid(ptr + "/format", "format must be a string")
            if f not in STRING_FORMATS and f not in INTEGER_FORMATS:
                self.unsupported(ptr + "/format", f"format {f!r} is not supported (supported: "
                                 + ", ".join(sorted(STRING_FORMATS) + sorted(INTEGER_FORMATS)) + ")")
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
                exact = self.oneof_exact(branches, parts, cp)
                if exact is not None:
                    node = exact
                    continue
                live = [p for p in parts if not self.is_never(p)]
                # proven after the whole document is reduced, when every referenced definition
                # (including ones still being built here, under recursion) is complete
                self.pending_oneof.append((cp, live))
                node = self.simplify_union(live)
        node = self.dependencies(s, ptr, node)
        if "not" in s:
            neg = self.translate(s["not"], ptr + "/not")
            comp = self.complement(neg, ptr + "/not")
            node = self.intersect(node, comp, ptr + "/not")
            if self.is_never(node):
                self.never_at(ptr + "/not")
        if "if" in s and self.dialect not in ("draft4", "draft6"):  # draft-07 and later (annotations before)
            node = self.conditional(s, ptr, node)
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
        if s.get("format") in STRING_FORMATS:
            present.add("string")
        elif s.get("format") in INTEGER_FORMATS:
            present.add("number")
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
            seen = set()  # json_key: equal JSON values once (an enum of 10,000 values is linear, not quadratic)
            for v in vals:
                k = json_key(v)
                if k not in seen and self.accepts(node, v, 0):
                    seen.add(k)
                    kept.append(v)
            if not kept:
                # no value: an empty schema (an optional property that must then be absent, a branch
                # that drops out); UnsatisfiableSchema at `where` only if the whole schema is empty
                self.never_at(where)
                return NEVER
            node = Const(kept, self.twins_ok(kept, node))
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
            fmt = s.get("format")
            mult = None
            if "multipleOf" in s:
                m = self._num(s, "multipleOf", ptr)
                if m <= 0:
                    self.invalid(ptr + "/multipleOf", "multipleOf must be greater than 0")
                if not float(m).is_integer():
                    self.unsupported(ptr + "/multipleOf", "multipleOf with a non-integer divisor is not supported "
                                     "(binary64 division makes it inexact)")
                mult = int(m)
            if t == "integer" or fmt in INTEGER_FORMATS or mult is not None:
                # integer-valued: `integer`, OpenAPI int32/int64 on numbers, integer multipleOf on numbers
                ilo = None if lo is None else (math.floor(lo) + 1 if lo_ex else math.ceil(lo))
                ihi = None if hi is None else (math.ceil(hi) - 1 if hi_ex else math.floor(hi))
                ilo = INT64_MIN if ilo is None else max(ilo, INT64_MIN)
                ihi = INT64_MAX if ihi is None else min(ihi, INT64_MAX)
                if fmt in INTEGER_FORMATS:
                    flo, fhi = INTEGER_FORMATS[fmt]
                    ilo, ihi = max(ilo, flo), min(ihi, fhi)
                if ilo > ihi:
                    self.never_at(ptr + "/minimum" if "minimum" in s else ptr)
                    return NEVER
                if mult is not None and mult != 1:
                    first = -(-ilo // mult) * mult
                    if first > ihi:
                        self.never_at(ptr + "/multipleOf")
                        return NEVER
                    count = (ihi - first) // mult + 1
                    if count > MAX_MULTIPLES:
                        self.unsupported(ptr + "/multipleOf", f"multipleOf {mult} over more than {MAX_MULTIPLES} "
                                         "integers is not supported (bound the range)")
                    # draft-04: 4.0 is not an `integer`
                    return Const(list(range(first, ihi + 1, mult)), not (self.draft4 and t == "integer"))
                return Integer(ilo, ihi)
            if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex))):
                self.never_at(ptr)
                return NEVER
            return Number(lo, lo_ex, hi, hi_ex)
        if t == "string":
            mn = self._nonneg_int(s, "minLength", ptr) if "minLength" in s else 0
            mx = self._nonneg_int(s, "maxLength", ptr) if "maxLength" in s else None
            pats = ()
            where = ptr
            if "pattern" in s:
                p = s["pattern"]
                where = ptr + "/pattern"
                if not isinstance(p, str):
                    self.invalid(ptr + "/pattern", "pattern must be a string")
                try:  # malformed: the schema is invalid; valid ECMAScript we do not support: unsupported
                    parse_regex(p, "InvalidSchema", "UnsupportedSchema")
                except ConstraintError as e:
                    raise ConstraintError(e.kind, f"pattern: {e.message}", ptr + "/pattern")
                pats = (p,)
            fmt = s.get("format")
            if fmt in STRING_FORMATS:
                pats = pats + (format_pattern(fmt),)
                where = ptr + "/format"
                if fmt in MAX_LENGTH:
                    mx = MAX_LENGTH[fmt] if mx is None else min(mx, MAX_LENGTH[fmt])
            if mx is not None and mn > mx:
                self.never_at(ptr + "/minLength")
                return NEVER
            if pats or "maxLength" in s:
                where = where if pats else ptr + "/maxLength"
            return String(mn, mx, pats, (), where)
        if t == "array":
            prefix = []
            items = ANY
            if "prefixItems" in s and self.dialect == "2020-12":
                pi = s["prefixItems"]
                if not isinstance(pi, list):
                    self.invalid(ptr + "/prefixItems", "prefixItems must be an array")
                prefix = [self.translate(x, f"{ptr}/prefixItems/{i}") for i, x in enumerate(pi)]
            # before 2020-12 `prefixItems` is not a keyword (an annotation)
            if "items" in s:
                it = s["items"]
                if isinstance(it, list):
                    if not self.items_array:
                        self.invalid(ptr + "/items", "items must be a schema in 2020-12 (use prefixItems)")
                    prefix = [self.translate(x, f"{ptr}/items/{i}") for i, x in enumerate(it)]
                    if "additionalItems" in s:
                        items = self.translate(s["additionalItems"], ptr + "/additionalItems")
                else:
                    items = self.translate(it, ptr + "/items")
            # `additionalItems` without an `items` array has no effect; in 2020-12 it is not a keyword
            mn = self._nonneg_int(s, "minItems", ptr) if "minItems" in s else 0
            mx = self._nonneg_int(s, "maxItems", ptr) if "maxItems" in s else None
            arr = self.norm_array(Array(prefix, items, mn, mx))
            if s.get("uniqueItems") is True:
                arr = self.unique_items(arr, ptr + "/uniqueItems")
            elif "uniqueItems" in s and not isinstance(s["uniqueItems"], bool):
                self.invalid(ptr + "/uniqueItems", "uniqueItems must be a boolean")
            return arr
        if t == "object":
            props = []
            if "properties" in s:
                ps = s["properties"]
                if not isinstance(ps, dict):
                    self.invalid(ptr + "/properties", "properties must be an object")
                props = [(k, self.translate(v, f"{ptr}/properties/{esc(k)}")) for k, v in ps.items()]
            pats = []
            if "patternProperties" in s:
                pp = s["patternProperties"]
                if not isinstance(pp, dict):
                    self.invalid(ptr + "/patternProperties", "patternProperties must be an object")
                for p, v in pp.items():
                    pp_ptr = f"{ptr}/patternProperties/{esc(p)}"
                    try:
                        parse_regex(p, "InvalidSchema", "UnsupportedSchema")
                    except ConstraintError as e:
                        raise ConstraintError(e.kind, f"pattern: {e.message}", pp_ptr)
                    pats.append((p, self.translate(v, pp_ptr)))
            req = ()
            if "required" in s:
                r = s["required"]
                if not isinstance(r, list) or not all(isinstance(x, str) for x in r):
                    self.invalid(ptr + "/required", "required must be an array of strings")
                req = tuple(dict.fromkeys(r))
            add = ANY
            if "additionalProperties" in s:
                add = self.translate(s["additionalProperties"], ptr + "/additionalProperties")
            mnp = self._nonneg_int(s, "minProperties", ptr) if "minProperties" in s else 0
            mxp = self._nonneg_int(s, "maxProperties", ptr) if "maxProperties" in s else None
            if len(pats) > MAX_PATTERN_PROPERTIES:
                self.unsupported(ptr + "/patternProperties",
                                 f"more than {MAX_PATTERN_PROPERTIES} patternProperties are not supported")
            o = Object(props, req, add, pats, mnp, mxp)
            o.regions = self.regions(pats, ptr + "/patternProperties")
            o.where = ptr + "/patternProperties" if pats else ptr
            o.props_where = ptr + "/properties"
            # a declared property also satisfies every patternProperties schema whose pattern it matches
            o.props = [(k, self.intersect(v, self.pattern_schema(o, k, ptr), ptr + "/patternProperties"))
                       for k, v in props]
            names = {k for k, _ in o.props}
            for r in req:
                if r not in names:
                    o.props.append((r, self.prop_schema(o, r, ptr)))
            o = self.norm_object(o)
            if o is NEVER and "required" in s:
                raise ConstraintError("UnsatisfiableSchema", "a required property can never appear", ptr + "/required")
            if o is NEVER:
                self.never_at(ptr + "/minProperties")
            return o
        raise AssertionError(t)

    # ---- helpers (issue 13) ----------------------------------------------------------
    def never_at(self, ptr):
        """Remember the first keyword that made a schema empty (the location of UnsatisfiableSchema)."""
        if self.never_reason is None:
            self.never_reason = ptr

    def regions(self, pats, ptr):
        """[(indices S, intersection of the schemas of the patterns in S)] for every non-empty S."""
        import itertools
        out = []
        for r in range(1, len(pats) + 1):
            for idx in itertools.combinations(range(len(pats)), r):
                node = ANY
                for i in idx:
                    node = self.intersect(node, pats[i][1], ptr)
                out.append((idx, node))
        return out

    def pattern_schema(self, o: Object, name: str, ptr: str) -> Node:
        """Intersection of the patternProperties schemas whose pattern matches `name` (ANY if none)."""
        node = ANY
        for p, v in o.patterns:
            if regex_search(p, name):
                node = self.intersect(node, v, ptr)
        return node

    def prop_schema(self, o: Object, name: str, ptr: str = "") -> Node:
        """The schema a member `name` of `o` must satisfy."""
        for k, v in o.props:
            if k == name:
                return v
        if any(regex_search(p, name) for p, _ in o.patterns):
            return self.pattern_schema(o, name, ptr)
        return o.additional

    def finite_values(self, n, depth=0):
        """The finite set of values of a node (list), or None when it is not finite/small."""
        n = resolve(n)
        if depth > 8 or isinstance(n, Ref):
            return None
        if n is NEVER:
            return []
        if isinstance(n, Const):
            return list(n.values)
        if isinstance(n, Null):
            return [None]
        if isinstance(n, Boolean):
            return [True, False]
        if isinstance(n, Integer) and n.hi - n.lo < 64:
            return list(range(n.lo, n.hi + 1))
        if isinstance(n, Union):
            out = []
            for a in n.alts:
                vs = self.finite_values(a, depth + 1)
                if vs is None:
                    return None
                out += [v for v in vs if not any(json_equal(v, w) for w in out)]
            return out
        return None

    def unique_items(self, arr, ptr):
        """uniqueItems: exact when at most one item is possible, or by enumerating every array of
        distinct values from a finite item domain (at most MAX_UNIQUE_ARRAYS arrays)."""
        if arr is NEVER or (isinstance(arr, Array) and arr.max_items is not None and arr.max_items <= 1):
            return arr
        import itertools
        doms = []
        width = max(len(arr.prefix), 1)
        for k in range(width + 1):
            sub = arr.prefix[k] if k < len(arr.prefix) else arr.items
            vs = self.finite_values(sub)
            if vs is None:
                self.unsupported(ptr, "uniqueItems over items without a small finite set of values is not supported")
            doms.append(vs)
        pool = []
        for vs in doms:
            pool += [v for v in vs if not any(json_equal(v, w) for w in pool)]
        hi = len(pool) if arr.max_items is None else min(arr.max_items, len(pool))
        out = []
        for n in range(arr.min_items, hi + 1):
            for combo in itertools.permutations(range(len(pool)), n):
                vals = [pool[i] for i in combo]
                if self.accepts(arr, vals, 0):
                    out.append(vals)
                    if len(out) > MAX_UNIQUE_ARRAYS:
                        self.unsupported(ptr, f"uniqueItems over more than {MAX_UNIQUE_ARRAYS} arrays is not supported")
        if not out:
            self.never_at(ptr)
            return NEVER
        return Const(out)

    def twins_ok(self, vals, node) -> bool:
        """True when the numeric twin (1 <-> 1.0) of every integral number in `vals` is accepted by
        `node` too (then a Const of `vals` may generate both spellings)."""
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 63:
                twin = int(v)
            elif isinstance(v, int) and abs(v) <= 2 ** 53:
                twin = float(v)
            else:
                continue
            if not self.accepts(node, twin, 0):
                return False
        return True

