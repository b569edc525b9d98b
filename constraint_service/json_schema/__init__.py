"""JSON Schema -> EBNF (seed 000, JSON Schema section; issue 4).

json_schema_to_ebnf(source) validates the source schema, reduces compositions to a schema graph
and emits an xgrammar EBNF grammar (rule `root`) whose language is exactly the schema's canonical
instances: compact separators, declared property order (declared properties first, then
additional ones), canonical JSON string escapes (as json.dumps(ensure_ascii=False)). Anything it
cannot enforce exactly is rejected with ConstraintError(kind, message, JSON Pointer).
"""
from __future__ import annotations

import json
import math

from ..errors import ConstraintError
from .common import esc
from .emit import emit_grammar
from .ir import NEVER, Ref, resolve
from .reduce import DIALECTS, Reducer


def _reject_constant(c):
    raise ConstraintError("InvalidSchema", f"invalid JSON constant {c}", "")


def parse_schema(source: str):
    try:
        return json.loads(source, parse_constant=_reject_constant)
    except ConstraintError:
        raise
    except (ValueError, TypeError) as e:
        raise ConstraintError("InvalidSchema", f"schema is not valid JSON: {e}", "")


def dialect_name(schema) -> str:
    """The dialect a schema declares with $schema: draft4, draft6, draft7, 2019-09 or 2020-12 (the
    default). Raises ConstraintError(UnsupportedSchema, "/$schema") for any other meta-schema."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return "2020-12"
    uri = schema["$schema"]
    if not isinstance(uri, str):
        raise ConstraintError("InvalidSchema", "$schema must be a string", "/$schema")
    for frag, name in DIALECTS:
        if frag in uri:
            return name
    raise ConstraintError("UnsupportedSchema", f"unsupported dialect {uri!r} (supported: draft-04, draft-06, "
                          "draft-07, 2019-09, 2020-12)", "/$schema")


def dialect_of(schema) -> tuple[bool, bool]:
    """(legacy draft 4/6/7 semantics, draft-04 semantics); kept for callers of the issue-4 API."""
    d = dialect_name(schema)
    return d in ("draft4", "draft6", "draft7"), d == "draft4"


def _reducer(schema, unknown_keywords):
    r = Reducer(schema, False, False, unknown_keywords, dialect=dialect_name(schema))
    r.index_ids()  # $id / id / $anchor in subschema positions only (never inside unknown keywords)
    return r


def reduce_schema(schema, unknown_keywords: str = "annotate"):
    r = _reducer(schema, unknown_keywords)
    node = r.translate(schema, "")
    r.check_oneof()
    if r.is_never(node):
        raise ConstraintError("UnsatisfiableSchema", "the schema has no valid instance",
                              r.never_reason if r.never_reason is not None else "")
    if _unproductive(node):  # e.g. {"$ref": "#"}: only an infinite instance would match
        raise ConstraintError("UnsatisfiableSchema", "the schema has no valid (finite) instance: every instance "
                              "needs another one inside it through a recursive $ref", _first_ref(schema))
    return node


def _first_ref(schema, ptr: str = "") -> str:
    """JSON Pointer of the first `$ref` keyword in document order (the location of a recursion error)."""
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            return ptr + "/$ref"
        for k, v in schema.items():
            found = _first_ref(v, f"{ptr}/{esc(str(k))}")
            if found:
                return found
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            found = _first_ref(v, f"{ptr}/{i}")
            if found:
                return found
    return ""


def _unproductive(root) -> bool:
    """True when the root cannot derive any finite instance (e.g. required self-recursion)."""
    from .ir import Array, Box, Object, Union
    memo: dict[Box, bool] = {}  # keyed by the Box object (alive in the graph), never by id()

    def prod(n, stack) -> bool:
        if isinstance(n, Ref):
            k = n.box
            if k in memo:
                return memo[k]
            if k in stack:
                return False
            stack.add(k)
            r = prod(n.box.node, stack) if n.box.node is not None else False
            stack.discard(k)
            if r:
                memo[k] = True
            return r
        if n is NEVER:
            return False
        if isinstance(n, Union):
            return any(prod(x, stack) for x in n.alts)
        if isinstance(n, Array):
            for k in range(n.min_items):
                sub = n.prefix[k] if k < len(n.prefix) else n.items
                if not prod(sub, stack):
                    return False
            return True
        if isinstance(n, Object):
            d = dict(n.props)
            return all(prod(d[r], stack) for r in n.required if r in d)
        return True

    return not prod(root, set())


def json_schema_to_ebnf(source: str, *, unknown_keywords: str = "annotate", expand_repetitions: bool = False) -> str:
    """Schema JSON text -> EBNF text with `root`. Raises ConstraintError(InvalidSchema |
    UnsupportedSchema | UnsatisfiableSchema, message, JSON Pointer of the keyword).

    A pure function of the schema text (issue 13: no cache keyed by object identity).

    unknown_keywords: "annotate" (default, issue 13: keywords that are neither assertions nor known
    annotations are annotations, as JSON Schema 2020-12 core section 4.3.1 and the `jsonschema`
    validator treat them; assertions the contract cannot enforce exactly stay located rejections) or
    "reject" (the stricter issue-4 behaviour: any unknown keyword is an UnsupportedSchema).

    expand_repetitions: write bounded repetitions out (same language; for lazily compiled grammars,
    see constraint_service.regex.ebnf.repeat)."""
    schema = parse_schema(source)
    node = reduce_schema(schema, unknown_keywords)
    return emit_grammar(node, expand_repetitions=expand_repetitions)


__all__ = ["json_schema_to_ebnf", "reduce_schema", "parse_schema"]


def canonicalize(schema, value):
    """Re-serialisation helper for tests/benchmarks: returns `value` in the canonical generation form of
    `schema`: object keys in generation order (declared properties first, in declared order, then the
    rest), a value equal to a const/enum member replaced by that member as written in the schema, and an
    integral float at an integer-only position written as an integer (the generation form of `integer` is
    a signed 64-bit integer literal, so the instance 1.0 is generated as 1)."""
    from .ir import Array, Const, Integer, Object, Union, json_equal
    from .keys import enumerated_keys
    try:
        r = _reducer(schema, "annotate")
        draft4 = r.draft4
        node = r.translate(schema, "")
    except ConstraintError:
        return value

    def canon(n, v, depth):
        n = resolve(n)
        if depth > 200:
            return v
        if isinstance(n, Union):
            pick = n.alts[0]
            for a in n.alts:
                try:
                    if r.accepts(a, v, 0):
                        pick = a
                        break
                except ConstraintError:
                    pass
            return canon(pick, v, depth + 1)
        if isinstance(n, Const):
            # finite values are generated as written in the schema (key order, 1 vs 1.0)
            for c in n.values:
                if json_equal(c, v):
                    return c
            return v
        if isinstance(n, Integer) and isinstance(v, float) and v.is_integer() and not draft4:
            # integers are generated as int64 literals: 1.0 is written 1 (draft-06 and later, where
            # 1.0 is an integer; in draft-04 it is not, and stays 1.0, which `integer` refuses)
            return int(v)
        if isinstance(v, dict) and isinstance(n, Object):
            d = dict(n.props)
            # members of finite undeclared key classes are generated after the declared ones, sorted
            listed = [k for k, _ in enumerated_keys(n) if k in v]
            keys = ([k for k, _ in n.props if k in v] + listed
                    + [k for k in v if k not in d and k not in listed])
            return {k: canon(r.prop_schema(n, k), v[k], depth + 1) for k in keys}
        if isinstance(v, list) and isinstance(n, Array):
            return [canon(n.prefix[i] if i < len(n.prefix) else n.items, x, depth + 1) for i, x in enumerate(v)]
        return v

    return canon(node, value, 0)
