"""Strict tool contract: checks a strict tool's parameters with the JSON Schema contract
(seed 000 §工具: "工具参数根节点须归约为 type=object … 要求 additionalProperties=false；归约后仍为根
const/enum/anyOf/oneOf 时返回不支持").

:func:`reduce_tool` reduces a tool's parameters once; the grammar builder emits from the result, and
every error is located inside that tool's parameters (``/tools/1/function/parameters/properties/days``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ninfer_common.frontends.rules import ToolCallFormat
from ninfer_common.frontends.tools import JSON, RAW, ToolDef, param_encodings, tool_pointer

from ..errors import ConstraintError
from ..json_schema import reduce_schema
from ..json_schema.ir import NEVER, Const, Node, Object, String, Union, resolve


def located(tool: ToolDef, err: ConstraintError) -> ConstraintError:
    """Re-roots a schema error (pointer relative to the parameters schema) at the tool's pointer."""
    return ConstraintError(err.kind, f"tool {tool.name!r}: {err.message}", tool_pointer(tool.index, "parameters") + err.location)


@dataclass
class StrictTool:
    """A strict tool's reduced parameters.

    Attributes:
        tool: the declaration.
        root: the reduced root (an :class:`Object` with ``additional`` NEVER).
        encodings: (xml wire) ``{property: "raw" | "json"}``, equal to
            :func:`ninfer_common.frontends.tools.param_encodings` (what the decoder uses).
    """

    tool: ToolDef
    root: Object
    encodings: dict[str, str]


def _is_raw_node(node: Node) -> bool | None:
    """True: string-only; False: no string; None: both (ambiguous on the raw wire)."""
    n = resolve(node)
    if isinstance(n, String):
        return True
    if isinstance(n, Const):
        kinds = {isinstance(v, str) for v in n.values}
        return True if kinds == {True} else (False if kinds == {False} else None)
    if isinstance(n, Union):
        parts = {_is_raw_node(a) for a in n.alts}
        return True if parts == {True} else (False if parts == {False} else None)
    if n is NEVER:
        return False
    if isinstance(n, Object) or type(n).__name__ in ("Array", "Integer", "Number", "Boolean", "Null"):
        return False
    return None  # ANY


def reduce_tool(tool: ToolDef, fmt: ToolCallFormat) -> StrictTool:
    """Reduces a strict tool's parameters and checks the strict route's requirements.

    Raises:
        ConstraintError: InvalidSchema / UnsupportedSchema / UnsatisfiableSchema located inside the
            tool's parameters: schema errors of the JSON Schema contract; a root that is not a closed
            object (``additionalProperties: false`` required); (xml wire) a property that may be a
            string or another type, a property name the wire cannot carry, a raw string with
            length/pattern assertions or a const/enum value holding the raw terminator.
    """
    ptr0 = tool_pointer(tool.index, "parameters")
    if tool.parameters is None:
        raise ConstraintError("UnsupportedSchema", f"strict tool {tool.name!r} needs a parameters schema "
                              "(a closed object)", ptr0)
    try:
        node = reduce_schema(tool.parameters)
    except ConstraintError as e:
        raise located(tool, e) from None
    root = resolve(node)
    if not isinstance(root, Object):
        raise ConstraintError("UnsupportedSchema", f"strict tool {tool.name!r}: the parameters must reduce to one "
                              "object schema (not a union, const or enum)", ptr0)
    if root.additional is not NEVER:
        raise ConstraintError("UnsupportedSchema", f"strict tool {tool.name!r}: strict parameters need "
                              "\"additionalProperties\": false", ptr0 + "/additionalProperties")
    encodings = param_encodings(tool)
    if fmt.wire == "xml":
        for name, sub in root.props:
            p = tool_pointer(tool.index, "parameters", "properties", name)
            if any(c in name for c in "<>\n"):
                raise ConstraintError("UnsupportedSchema", f"property name {name!r} cannot be written as "
                                      "<parameter=NAME> (holds '<', '>' or a newline)", p)
            raw = _is_raw_node(sub)
            if raw is None:
                raise ConstraintError("UnsupportedSchema", f"property {name!r} may be a string or another type; "
                                      "the raw parameter form cannot tell them apart", p)
            if (RAW if raw else JSON) != encodings.get(name):
                raise ConstraintError("UnsupportedSchema", f"property {name!r}: cannot decide between a raw string "
                                      "and a JSON value from the schema", p)
            n = resolve(sub)
            if raw and isinstance(n, String) and (n.min_len or n.max_len is not None or n.patterns):
                raise ConstraintError("UnsupportedSchema", f"property {name!r}: length/pattern assertions on raw "
                                      "string parameters are not supported", p)
            if raw and isinstance(n, Union):
                raise ConstraintError("UnsupportedSchema", f"property {name!r}: unions of string forms are not "
                                      "supported as raw parameters", p)
            if raw and isinstance(n, Const):
                for v in n.values:
                    if fmt.raw_terminator in v:
                        raise ConstraintError("UnsupportedSchema", f"property {name!r}: the value {v!r} holds the "
                                              f"raw terminator {fmt.raw_terminator!r} and cannot be represented", p)
    return StrictTool(tool=tool, root=root, encodings=encodings)
