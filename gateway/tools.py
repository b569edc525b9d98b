"""Tool calling and thinking: the protocol-side mapping, switched off until the engine API carries it.

Seed 000 §tools: a tool call policy has three independent parts — the envelope
(names), the per-tool ``strict`` parameter schema, and the choice/count
(``auto | none | required``, allowed names, parallel). The three HTTP protocols
map their fields onto that one contract:

=================  ==========================  =============================================
protocol           field                       :class:`ToolPolicy`
=================  ==========================  =============================================
OpenAI Chat        ``tool_choice`` auto/none/   choice; named -> required + [name] +
                   required/named,              parallel=False; ``parallel_tool_calls``
                   ``parallel_tool_calls``
OpenAI Responses   same, ``{"type":"function",  same
                   "name"}`` for named
Anthropic          ``tool_choice`` auto/any/    any -> required; tool -> required + [name];
                   tool/none,                   parallel = not disable_parallel_tool_use
                   ``disable_parallel_tool_use``
=================  ==========================  =============================================

Everything here validates the fields (so a malformed tool is still a 400 with its
field path) and builds the neutral :class:`ToolPolicy`; :func:`require_engine_tools`
then rejects with 400 "requires tools support in the engine API" because the public
``ninfer.v1`` proto has no tools/tool_choice/thinking fields yet (issue 10 adds them).
When it does, :func:`require_engine_tools` becomes the place that fills the request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import THINKING_NOT_SUPPORTED, TOOLS_NOT_SUPPORTED, ApiError, invalid


@dataclass
class ToolSpec:
    """One function tool: name, parameter JSON Schema, strict flag and the field path of
    its schema (``tools[1].function.parameters`` / ``tools[0].input_schema``) for error mapping."""

    name: str
    description: str
    parameters: Any
    strict: bool
    schema_path: str


@dataclass
class ToolPolicy:
    """The seed's common tool contract.

    Attributes:
        tools: declared tools (all of them stay in the prompt whatever the choice).
        choice: ``"auto" | "none" | "required"``.
        allowed_names: names allowed this turn (empty = all).
        parallel: more than one call allowed.
    """

    tools: list[ToolSpec] = field(default_factory=list)
    choice: str = "auto"
    allowed_names: list[str] = field(default_factory=list)
    parallel: bool = True


def _tool_names(tools: list[ToolSpec]) -> set[str]:
    return {t.name for t in tools}


def _check_unique(tools: list[ToolSpec], path: str) -> None:
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise invalid(f"{path}[{i}].name", f"duplicate tool name {t.name!r}")
        seen.add(t.name)


def openai_chat_tools(body: dict) -> ToolPolicy | None:
    """Parses Chat Completions ``tools`` / ``tool_choice`` / ``parallel_tool_calls``.

    Returns None when no tool field asks for anything (no tools, choice absent or ``none``).
    """
    tools_raw = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools_raw and choice in (None, "none"):
        return None
    if not isinstance(tools_raw, list):
        raise invalid("tools", "expected an array")
    tools = []
    for i, t in enumerate(tools_raw):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise invalid(f"tools[{i}]", "expected {\"type\": \"function\", \"function\": {...}}")
        fn = t["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"tools[{i}].function.name", "is required")
        tools.append(ToolSpec(fn["name"], fn.get("description") or "", fn.get("parameters", {}),
                              bool(fn.get("strict")), f"tools[{i}].function.parameters"))
    _check_unique(tools, "tools")
    policy = ToolPolicy(tools=tools, parallel=body.get("parallel_tool_calls") is not False)
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or name not in _tool_names(tools):
            raise invalid("tool_choice.function.name", f"names no declared tool: {name!r}")
        policy.choice, policy.allowed_names, policy.parallel = "required", [name], False
    elif choice in (None, "auto", "none", "required"):
        policy.choice = choice or "auto"
    else:
        raise invalid("tool_choice", f"expected auto, none, required or a named function, got {choice!r}")
    return policy


def responses_tools(body: dict) -> ToolPolicy | None:
    """Parses Responses ``tools`` (function tools) / ``tool_choice`` / ``parallel_tool_calls``."""
    tools_raw = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools_raw and choice in (None, "none"):
        return None
    if not isinstance(tools_raw, list):
        raise invalid("tools", "expected an array")
    tools = []
    for i, t in enumerate(tools_raw):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise invalid(f"tools[{i}].type", "only function tools are supported")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise invalid(f"tools[{i}].name", "is required")
        tools.append(ToolSpec(t["name"], t.get("description") or "", t.get("parameters", {}),
                              t.get("strict") is not False, f"tools[{i}].parameters"))
    _check_unique(tools, "tools")
    policy = ToolPolicy(tools=tools, parallel=body.get("parallel_tool_calls") is not False)
    if isinstance(choice, dict):
        name = choice.get("name")
        if choice.get("type") != "function" or name not in _tool_names(tools):
            raise invalid("tool_choice", f"names no declared function tool: {name!r}")
        policy.choice, policy.allowed_names, policy.parallel = "required", [name], False
    elif choice in (None, "auto", "none", "required"):
        policy.choice = choice or "auto"
    else:
        raise invalid("tool_choice", f"expected auto, none, required or a named function, got {choice!r}")
    return policy


def anthropic_tools(body: dict) -> ToolPolicy | None:
    """Parses Messages ``tools`` (``input_schema``, ``strict``) / ``tool_choice``
    (auto/any/tool/none, ``disable_parallel_tool_use``)."""
    tools_raw = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools_raw and (choice is None or (isinstance(choice, dict) and choice.get("type") == "none")):
        return None
    if not isinstance(tools_raw, list):
        raise invalid("tools", "expected an array")
    tools = []
    for i, t in enumerate(tools_raw):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise invalid(f"tools[{i}].name", "is required")
        if t.get("type") not in (None, "custom"):
            raise invalid(f"tools[{i}].type", f"server tools are not supported: {t.get('type')!r}")
        if not isinstance(t.get("input_schema"), dict):
            raise invalid(f"tools[{i}].input_schema", "is required")
        tools.append(ToolSpec(t["name"], t.get("description") or "", t["input_schema"], bool(t.get("strict")),
                              f"tools[{i}].input_schema"))
    _check_unique(tools, "tools")
    policy = ToolPolicy(tools=tools)
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise invalid("tool_choice.type", "expected auto, any, tool or none")
        policy.parallel = not choice.get("disable_parallel_tool_use", False)
        ctype = choice["type"]
        if ctype == "tool":
            if choice.get("name") not in _tool_names(tools):
                raise invalid("tool_choice.name", f"names no declared tool: {choice.get('name')!r}")
            policy.choice, policy.allowed_names = "required", [choice["name"]]
        else:
            policy.choice = {"auto": "auto", "any": "required", "none": "none"}[ctype]
    return policy


def require_engine_tools(policy: ToolPolicy, field_name: str = "tools") -> None:
    """The switch point: fills the engine request once the public API carries tools.

    Raises:
        ApiError: always for now — 400 ``"<field>: requires tools support in the engine API"``.
    """
    raise ApiError(400, f"{field_name}: {TOOLS_NOT_SUPPORTED}", field_name, "NotSupported")


def reject_tool_history(path: str) -> None:
    """Tool calls / tool results in the conversation history need the engine's tool-aware
    chat template (issue 10); 400 until then."""
    raise ApiError(400, f"{path}: {TOOLS_NOT_SUPPORTED} (tool calls and results in the history)", path,
                   "NotSupported")


def require_engine_thinking(path: str) -> None:
    """Thinking/reasoning requests (``thinking``, ``reasoning``, ``reasoning_effort``, the
    NInfer ``thinking_budget`` extension); 400 until the public API carries them.

    Response mapping when switched on: Chat -> ``message.reasoning_content`` (vLLM/SGLang
    convention), Responses -> a ``reasoning`` output item, Messages -> ``thinking`` blocks.
    """
    raise ApiError(400, f"{path}: {THINKING_NOT_SUPPORTED}", path, "NotSupported")
