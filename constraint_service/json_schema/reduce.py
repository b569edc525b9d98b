"""Source-schema validation and reduction of compositions to the IR graph."""
from __future__ import annotations

import math

from ..errors import ConstraintError
from ..regex import parse_regex, regex_search
from .ir import (ANY, NEVER, Array, Boolean, Box, Const, Integer, Node, Null, Number, Object, Ref,
                 String, Union, is_empty, json_equal, json_type, resolve)
from .keys import undeclared_capacity
from .formats import INTEGER_FORMATS, MAX_LENGTH, STRING_FORMATS, format_pattern
from .numbers import INT64_MAX, INT64_MIN

MAX_DEPENDENCIES = 6      # dependencies expand to 2^k object alternatives
MAX_UNIQUE_ARRAYS = 4_096  # uniqueItems over a finite item domain: arrays enumerated
MAX_MULTIPLES = 4_096      # multipleOf on integers: multiples enumerated within the bounds
MAX_PATTERN_PROPERTIES = 4  # undeclared keys split into 2^k - 1 pattern classes

MAX_MERGES = 16_384
MAX_VALUE_DEPTH = 256

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
MAX_COMPLEMENT_DEPTH = 8   # `not` / oneOf / if: nesting of complemented object properties
# dialects (issue 13): $schema URI fragment -> name; `legacy` drafts (4, 6, 7) take `items` arrays with
# `additionalItems` and ignore the siblings of `$ref`
DIALECTS = (("json-schema.org/draft-04/schema", "draft4"), ("json-schema.org/draft-06/schema", "draft6"),
            ("json-schema.org/draft-07/schema", "draft7"), ("json-schema.org/draft/2019-09/schema", "2019-09"),
            ("json-schema.org/draft/2020-12/schema", "2020-12"))
DEFAULT_BASE = "https://ninfer.invalid/schema.json"
# where subschemas (and so identifiers) live: keyword -> {name: schema}, [schema], or one schema
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
SCHEMA_ONE = {"additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contentSchema"}
ALL_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def _regex_literal(text: str) -> str:
    """ECMAScript pattern matching exactly `text` (syntax characters escaped)."""
    return "".join("\\" + c if c in "^$\\.*+?()[]{}|/" else c for c in text)


def esc(tok: str) -> str:
    return tok.replace("~", "~0").replace("/", "~1")


def unesc(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


class Reducer:
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

    # ---- refs ------------------------------------------------------------
    def index_ids(self):
        """Collect $id/id identifiers and $anchor names with their base URIs (JSON Schema core 8.2)."""
        from urllib.parse import urldefrag, urljoin
        root_base = DEFAULT_BASE
        self.resources[""] = ""

        def walk(s, ptr, base, depth):
            if depth > MAX_VALUE_DEPTH:
                return
            if isinstance(s, dict):
                ident = s.get(self.id_keyword)
                if self.draft7 and "$ref" in s:
                    ident = None  # drafts 4-7: a sibling of $ref (even $id) is ignored
                if isinstance(ident, str):
                    uri, frag = urldefrag(urljoin(base, ident))
                    if uri:
                        base = uri
                        self.resources.setdefault(uri, ptr)
                    if frag and not frag.startswith("/"):
                        self.named_anchors.setdefault((base, frag), ptr)  # draft-06/07 "$id": "#name"
                    self.bases[ptr] = base
                a = s.get("$anchor")
                if isinstance(a, str):
                    self.named_anchors.setdefault((base, a), ptr)
                    self.anchors.setdefault(a, ptr)
                for k, v in s.items():
                    kp = f"{ptr}/{esc(k)}"
                    if k in SCHEMA_MAPS and isinstance(v, dict):
                        for name, sub in v.items():
                            walk(sub, f"{kp}/{esc(name)}", base, depth + 1)
                    elif k in SCHEMA_LISTS and isinstance(v, list):
                        for i, sub in enumerate(v):
                            walk(sub, f"{kp}/{i}", base, depth + 1)
                    elif k in SCHEMA_ONE or (k in SCHEMA_LISTS and isinstance(v, dict)):
                        walk(v, kp, base, depth + 1)
                    # anything else (unknown keywords, enum/const values) holds no identifiers
        if isinstance(self.root, dict):
            ident = self.root.get(self.id_keyword)
            if isinstance(ident, str):
                uri = urldefrag(urljoin(DEFAULT_BASE, ident))[0]
                if uri:
                    root_base = uri
        self.resources[root_base] = ""
        self.resources[DEFAULT_BASE] = ""
        self.bases[""] = root_base
        walk(self.root, "", root_base, 0)

    def base_of(self, ptr: str) -> str:
        """Base URI in force at the schema at `ptr` (the nearest enclosing $id/id)."""
        while True:
            if ptr in self.bases:
                return self.bases[ptr]
            if not ptr:
                return DEFAULT_BASE
            ptr = ptr[:ptr.rindex("/")]

    def follow(self, start: str, frag: str, ref: str, ptr: str):
        """The value at JSON Pointer `frag` (URI-decoded) from the document position `start`."""
        from urllib.parse import unquote
        cur = self.root
        path = ""
        for raw in [t for t in start.split("/")[1:]] if start else []:
            tok = unesc(raw)
            cur = cur[int(tok)] if isinstance(cur, list) else cur[tok]
            path += "/" + raw
        if frag == "":
            return cur, path
        for raw in frag[1:].split("/"):
            tok = unesc(unquote(raw))
            if isinstance(cur, dict) and tok in cur:
                cur = cur[tok]
            elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
                cur = cur[int(tok)]
            else:
                self.invalid(ptr, f"unresolvable $ref {ref!r}")
            path += "/" + esc(tok)
        return cur, path

    def lookup(self, ref: str, ptr: str, at: str | None = None):
        """Resolve `ref` (written in the schema at document pointer `at`) against the base URI in force
        there: local JSON Pointers, $id/id-identified resources of this document, $anchor / "#name"
        anchors. Anything else is an external reference (UnsupportedSchema at `ptr`)."""
        from urllib.parse import unquote, urldefrag, urljoin
        if not self.bases:
            self.index_ids()
        if at is None:
            at = ptr[:-len("/$ref")] if ptr.endswith("/$ref") else ptr
        try:
            uri, frag = urldefrag(urljoin(self.base_of(at), ref))
        except ValueError:
            self.invalid(ptr, f"malformed $ref {ref!r}")
        if uri not in self.resources:
            self.unsupported(ptr, f"external or non-local $ref {ref!r} is not supported")
        start = self.resources[uri]
        if frag == "" or frag.startswith("/"):
            return self.follow(start, frag, ref, ptr)
        name = unquote(frag)
        if (uri, name) in self.named_anchors:
            return self.follow(self.named_anchors[(uri, name)], "", ref, ptr)
        if uri == self.bases[""] and name in self.anchors:
            return self.follow(self.anchors[name], "", ref, ptr)
        self.invalid(ptr, f"unresolvable $ref {ref!r} (no anchor {name!r})")

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
        if "if" in s and self.dialect not in ("draft4", "draft6"):  # draft-07 and later (annotations before)
            node = self.conditional(s, ptr, node)
        return node

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
            for v in vals:
                if self.accepts(node, v, 0) and not any(json_equal(v, k) for k in kept):
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
                try:
                    parse_regex(p, "UnsupportedSchema")
                except ConstraintError as e:
                    raise ConstraintError("UnsupportedSchema", f"pattern: {e.message}", ptr + "/pattern")
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
                        parse_regex(p, "UnsupportedSchema")
                    except ConstraintError as e:
                        raise ConstraintError("UnsupportedSchema", f"pattern: {e.message}", pp_ptr)
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
