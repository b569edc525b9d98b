"""Schema IR: the reduced, compilable schema graph (per-type constraint records, unions, finite values, refs)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_ids = itertools.count()


class Node:
    pass


class AnyNode(Node):
    def __repr__(self):
        return "Any"


class NeverNode(Node):
    def __repr__(self):
        return "Never"


ANY = AnyNode()
NEVER = NeverNode()


@dataclass(eq=False)
class Union(Node):
    alts: list


@dataclass(eq=False)
class Const(Node):
    values: list  # JSON values (already filtered)
    # also generate the numeric twin of an integral value (1 for 1.0, 1.0 for 1: equal in JSON Schema);
    # False where a twin is not an instance, e.g. 1.0 under a draft-04 `integer` (issue 13)
    twins: bool = True


@dataclass(eq=False)
class Box:
    """A named node; references to it become a grammar rule (allows recursion)."""
    pointer: str
    node: Node | None = None
    building: bool = False
    uid: int = field(default_factory=lambda: next(_ids))


@dataclass(eq=False)
class Ref(Node):
    box: Box


@dataclass(eq=False)
class Null(Node):
    pass


@dataclass(eq=False)
class Boolean(Node):
    pass


@dataclass(eq=False)
class Integer(Node):
    lo: int | None = None  # inclusive, exact
    hi: int | None = None


@dataclass(eq=False)
class Number(Node):
    lo: object = None      # int/float or None
    lo_ex: bool = False
    hi: object = None
    hi_ex: bool = False


@dataclass(eq=False)
class String(Node):
    min_len: int = 0
    max_len: int | None = None
    patterns: tuple = ()       # ECMAScript patterns the string must match (search semantics)
    neg_patterns: tuple = ()   # patterns the string must NOT match (from `not`, issue 13)
    where: str = ""            # JSON Pointer of the keyword that introduced the constraints (errors)


@dataclass(eq=False)
class Array(Node):
    prefix: list = field(default_factory=list)
    items: Node = ANY
    min_items: int = 0
    max_items: int | None = None


@dataclass(eq=False)
class Object(Node):
    props: list = field(default_factory=list)  # [(name, node)] in declared order
    required: tuple = ()
    additional: Node = ANY     # for keys neither declared nor matching a pattern
    patterns: list = field(default_factory=list)  # [(ECMAScript pattern, node)]: patternProperties
    min_props: int = 0
    max_props: int | None = None
    regions: list = field(default_factory=list)   # [(indices of matching patterns, node)], non-empty sets
    where: str = ""            # JSON Pointer of patternProperties / minProperties (errors)
    props_where: str = ""      # JSON Pointer of the `properties` keyword (errors: the optional-property limit)


TYPE_NAMES = ("null", "boolean", "object", "array", "number", "string", "integer")


def resolve(n: Node) -> Node:
    seen = 0
    while isinstance(n, Ref):
        if n.box.node is None:
            return n
        n = n.box.node
        seen += 1
        if seen > 1000:
            break
    return n


def is_empty(n: Node) -> bool:
    """True when `n` (through finished references) admits no value: NEVER or a union of nothing."""
    n = resolve(n)
    return n is NEVER or (isinstance(n, Union) and not n.alts)


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    raise TypeError(type(v))


def json_key(v):
    """A hashable key of a JSON value with ``json_key(a) == json_key(b)`` iff ``json_equal(a, b)``: booleans
    apart from numbers, 1 and 1.0 the same number, arrays element-wise, objects by key set and values."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)  # int/float compare and hash by value: 1 == 1.0, hash(1) == hash(1.0)
    if isinstance(v, list):
        return ("a", tuple(json_key(x) for x in v))
    if isinstance(v, dict):
        return ("o", frozenset((k, json_key(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
