"""Tool definitions and the ToolChoice contract (seed 000 §工具与 ToolChoice).

Pure data + validation shared by the engine (prompt rendering, decoding) and the
sidecar (grammar). The schema-level checks of strict tools (JSON Schema
contract) live in ``constraint_service.tools.contract``; this module checks
names, duplicates, JSON syntax and the choice/constraint combination, and
computes each parameter's value encoding (raw string vs JSON) that both the
grammar and the decoder use.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .errors import FrontendError
from .rules import OutputRules

#: Tool names: OpenAI's rule (letters, digits, ``_``, ``-``; 1-64 chars) plus ``.``.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

MODES = ("auto", "none", "required")
CONSTRAINT_MODES = ("basic", "automatic")
#: Body constraint kinds that may stand beside active tools (seed: JSON object / JSON Schema only).
BODY_KINDS_WITH_TOOLS = ("json_object", "json_schema")


def tool_pointer(index: int, *parts: str) -> str:
    """JSON Pointer of a tool field: ``tool_pointer(1, "parameters", "properties", "days")`` ->
    ``/tools/1/function/parameters/properties/days`` (``~``/``/`` escaped)."""
    esc = [p.replace("~", "~0").replace("/", "~1") for p in parts]
    return "/".join([f"/tools/{index}/function", *esc])


@dataclass(frozen=True)
class ToolDef:
    """One declared function tool.

    Attributes:
        name: unique name (:data:`TOOL_NAME_RE`).
        description: shown to the model.
        parameters: the arguments JSON Schema (parsed, key order kept), or None (any object).
        strict: enforce ``parameters`` with the JSON Schema contract.
        index: position in the request's tool list (for error pointers).
    """

    name: str
    description: str = ""
    parameters: Any = None
    strict: bool = False
    index: int = 0

    def to_openai(self) -> dict:
        """The ``{"type": "function", "function": {...}}`` dict a chat template receives as ``tools``."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolChoice:
    """The call policy (seed: Auto/None/Required, allowed_names, parallel, Automatic/Basic).

    A named choice is ``ToolChoice("required", ("NAME",), parallel=False)``.
    """

    mode: str = "auto"
    allowed_names: tuple[str, ...] = ()
    parallel: bool = True
    constraints: str = "basic"


@dataclass(frozen=True)
class ToolPolicy:
    """What this turn may output, resolved from tools + choice + body constraint.

    Attributes:
        tools: the declared tools (all stay in the prompt).
        callable: tools the model may call this turn (``()`` = no calls).
        min_calls, max_calls: call count bounds (``max_calls`` None = unbounded).
        content_allowed: content (or the JSON body) may be produced instead of calls.
        constrained: the tool part is enforced by the grammar (False only for
            Automatic + auto + non-strict + no allowed-name restriction).
        body_kind: the body constraint kind or None.
    """

    tools: tuple[ToolDef, ...] = ()
    callable: tuple[ToolDef, ...] = ()
    min_calls: int = 0
    max_calls: int | None = None
    content_allowed: bool = True
    constrained: bool = False
    body_kind: str | None = None

    @property
    def calls_possible(self) -> bool:
        return bool(self.callable) and (self.max_calls is None or self.max_calls > 0)

    def tool(self, name: str) -> ToolDef | None:
        for t in self.callable:
            if t.name == name:
                return t
        return None


def parse_tools(entries: Iterable[Any]) -> tuple[ToolDef, ...]:
    """Validates declared tools.

    Args:
        entries: ``(name, description, parameters_json_text, strict)`` tuples,
            :class:`ToolDef` objects, or OpenAI-style dicts.
    Returns:
        The tools in order, ``parameters`` parsed (order-preserving).
    Raises:
        FrontendError: InvalidRequest for a bad or duplicate name (seed:
            "工具定义中的重复名称在准备阶段拒绝"), InvalidSchema for parameters
            that are not a JSON object / boolean, located at ``/tools/i/function/...``.
    """
    out: list[ToolDef] = []
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if isinstance(e, ToolDef):
            name, desc, params, strict = e.name, e.description, e.parameters, e.strict
            params_text = None
        elif isinstance(e, dict):
            fn = e.get("function", e)
            name, desc, params, strict = fn.get("name"), fn.get("description", ""), fn.get("parameters"), fn.get("strict", False)
            params_text = params if isinstance(params, str) else None
        else:
            name, desc, params_text, strict = e
            params = None
        if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
            raise FrontendError("InvalidRequest", f"tool {i}: name must match {TOOL_NAME_RE.pattern}, got {name!r}",
                                tool_pointer(i, "name"))
        if name in seen:
            raise FrontendError("InvalidRequest", f"duplicate tool name {name!r} (also tool {seen[name]})",
                                tool_pointer(i, "name"))
        seen[name] = i
        if params_text is not None:
            if params_text.strip() == "":
                params = None
            else:
                try:
                    params = json.loads(params_text)
                except ValueError as ex:
                    raise FrontendError("InvalidSchema", f"tool {name!r}: parameters are not valid JSON: {ex}",
                                        tool_pointer(i, "parameters")) from None
        if params is not None and not isinstance(params, (dict, bool)):
            raise FrontendError("InvalidSchema", f"tool {name!r}: parameters must be a JSON Schema object, "
                                f"got {type(params).__name__}", tool_pointer(i, "parameters"))
        out.append(ToolDef(name=name, description=str(desc or ""), parameters=params, strict=bool(strict), index=i))
    return tuple(out)


def resolve_policy(tools: Sequence[ToolDef], choice: ToolChoice | None, body_kind: str | None) -> ToolPolicy:
    """Combines tools, choice and body constraint into the turn's :class:`ToolPolicy`.

    Rules (seed 000 §工具): auto = zero or more calls (content first allowed);
    required = at least one call, nothing before it; none = content only,
    declarations stay in the prompt and the call tag is banned; parallel=false
    caps calls at one; allowed_names restricts callable tools. JSON object /
    JSON Schema bodies may stand beside active tools (auto = union); GBNF,
    regex and choice bodies with active tools are rejected.

    Raises:
        FrontendError: InvalidRequest for an unknown mode, an allowed name that is
            not declared, choice without tools, or a forbidden body + tools combination.
    """
    choice = choice or ToolChoice()
    if choice.mode not in MODES:
        raise FrontendError("InvalidRequest", f"tool_choice must be one of {MODES}, got {choice.mode!r}", "/tool_choice")
    if choice.constraints not in CONSTRAINT_MODES:
        raise FrontendError("InvalidRequest", f"tool constraint mode must be one of {CONSTRAINT_MODES}, "
                            f"got {choice.constraints!r}", "/tool_choice/constraints")
    tools = tuple(tools)
    if not tools:
        if choice.mode == "required" or choice.allowed_names:
            raise FrontendError("InvalidRequest", "tool_choice requires tools, but the request declares none", "/tool_choice")
        return ToolPolicy(body_kind=body_kind)
    names = {t.name: t for t in tools}
    for j, n in enumerate(choice.allowed_names):
        if n not in names:
            raise FrontendError("InvalidRequest", f"tool_choice names {n!r}, which is not a declared tool "
                                f"(declared: {sorted(names)})", f"/tool_choice/allowed_names/{j}")
    callable_ = tuple(t for t in tools if not choice.allowed_names or t.name in choice.allowed_names)
    if choice.mode == "none":
        return ToolPolicy(tools=tools, callable=(), min_calls=0, max_calls=0, content_allowed=True,
                          constrained=choice.constraints == "basic" and body_kind is None, body_kind=body_kind)
    if body_kind is not None and body_kind not in BODY_KINDS_WITH_TOOLS:
        raise FrontendError("InvalidRequest", f"a {body_kind} body constraint cannot be combined with active tools "
                            "(only json_object / json_schema can; use tool_choice none)", "/constraint")
    max_calls = None if choice.parallel else 1
    required = choice.mode == "required"
    constrained = (choice.constraints == "basic" or required or bool(choice.allowed_names) or not choice.parallel
                   or any(t.strict for t in callable_) or body_kind is not None)
    return ToolPolicy(tools=tools, callable=callable_, min_calls=1 if required else 0, max_calls=max_calls,
                      content_allowed=not required, constrained=constrained, body_kind=body_kind)


# ---- parameter value encodings (xml wire) -------------------------------------------------------

RAW = "raw"    # the value is the raw string between the framing newlines
JSON = "json"  # the value is JSON text


def _local(schema: Any, root: Any, depth: int = 0) -> Any:
    """Follows a local ``$ref`` chain (``#/...``); returns the target (or the schema itself)."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#") and depth < 64:
        node = root
        for part in schema["$ref"][1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return schema
        schema = node
        depth += 1
    return schema


def value_types(schema: Any, root: Any) -> set[str] | None:
    """The JSON types a property schema can take (``None`` = any), from ``type``/``const``/``enum``/
    ``anyOf``/``oneOf``/``allOf`` (intersected) and local ``$ref``s; a heuristic read of the schema
    that :mod:`constraint_service.tools.contract` cross-checks against its reduction for strict tools."""
    s = _local(schema, root)
    if s is True or s is None or s == {}:
        return None
    if s is False:
        return set()
    if not isinstance(s, dict):
        return None
    out: set[str] | None = None

    def meet(a, b):
        if a is None:
            return b
        if b is None:
            return a
        return a & b

    t = s.get("type")
    if isinstance(t, str):
        out = meet(out, {t})
    elif isinstance(t, list):
        out = meet(out, {x for x in t if isinstance(x, str)})
    for key in ("const",):
        if key in s:
            out = meet(out, {_json_type(s[key])})
    if isinstance(s.get("enum"), list):
        out = meet(out, {_json_type(v) for v in s["enum"]})
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            alts = [value_types(a, root) for a in s[key]]
            out = meet(out, None if any(a is None for a in alts) else set().union(*alts))
    if isinstance(s.get("allOf"), list):
        for a in s["allOf"]:
            out = meet(out, value_types(a, root))
    if out is not None and "integer" in out:
        out = out | {"number"} if "number" in out else out
    return out


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def param_encodings(tool: ToolDef) -> dict[str, str]:
    """(xml wire) The encoding of each declared property: :data:`RAW` for a string-only value,
    :data:`JSON` otherwise (seed: "纯字符串参数使用 raw string；不含 string 的类型联合使用 JSON 值").

    Non-strict tools follow the normalisation hint of the seed's basic language: a property whose
    types include string is read raw. For strict tools a union of string and other types is
    ambiguous and rejected by :func:`ambiguous_params`.
    """
    p = tool.parameters
    props = _local(p, p).get("properties", {}) if isinstance(_local(p, p), dict) else {}
    out: dict[str, str] = {}
    if not isinstance(props, dict):
        return out
    for name, sub in props.items():
        types = value_types(sub, p)
        if types is not None and types and types <= {"string"}:
            out[name] = RAW
        elif not tool.strict and (types is None or "string" in types):
            out[name] = RAW if types is not None else JSON
        else:
            out[name] = JSON
    return out


def ambiguous_params(tool: ToolDef) -> list[str]:
    """(xml wire, strict) properties whose value may be a string or another type: the raw wire
    form cannot tell them apart, so a strict tool with one is rejected before queueing."""
    p = tool.parameters
    root = _local(p, p)
    props = root.get("properties", {}) if isinstance(root, dict) else {}
    bad = []
    for name, sub in (props.items() if isinstance(props, dict) else ()):
        types = value_types(sub, p)
        if types is None or ("string" in types and len(types) > 1):
            bad.append(name)
    return bad
