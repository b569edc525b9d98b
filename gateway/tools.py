"""Tool calling and thinking: the protocol-side mapping onto the public ``ninfer.v1`` fields
(``GenerateRequest.tools`` / ``tool_choice`` / ``thinking``).

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

Everything here validates the fields (a malformed tool is a 400 with its field path)
and builds the neutral :class:`ToolPolicy`, which :func:`apply_tools` copies into the
engine request. Schema errors the engine finds come back located at
``/tools/i/function/parameters/...`` and are mapped to the protocol's own path by
:func:`gateway.engine.tool_location`.

Thinking: Chat / Responses take the NInfer extension ``thinking: {type, budget_tokens}``
(Anthropic's shape) and vLLM's ``chat_template_kwargs.enable_thinking``; Messages takes
its own ``thinking``. Output: Chat ``message.reasoning_content`` (vLLM/SGLang), Responses
``reasoning`` items, Messages ``thinking`` blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import json
import uuid

from ninfer.v1 import generation_pb2 as pb

from .errors import invalid


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


def _openai_policy(body: dict, tools: list[ToolSpec], choice, named: str | None, named_loc: str,
                   what: str) -> ToolPolicy:
    """The policy of OpenAI-shaped ``tool_choice`` (``auto`` / ``none`` / ``required`` / a named function,
    whose name the caller extracted as ``named``) and ``parallel_tool_calls``, shared by Chat Completions and
    Responses.

    Raises:
        ApiError: (400) a duplicate tool name, a named choice naming no declared tool (at ``named_loc``), or an
            unknown choice.
    """
    _check_unique(tools, "tools")
    policy = ToolPolicy(tools=tools, parallel=body.get("parallel_tool_calls") is not False)
    if isinstance(choice, dict):
        if choice.get("type") != "function" or named not in _tool_names(tools):
            raise invalid(named_loc, f"names no declared {what}: {named!r}")
        policy.choice, policy.allowed_names, policy.parallel = "required", [named], False
    elif choice in (None, "auto", "none", "required"):
        policy.choice = choice or "auto"
    else:
        raise invalid("tool_choice", f"expected auto, none, required or a named function, got {choice!r}")
    return policy


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
    fn = choice.get("function") if isinstance(choice, dict) else None
    named = fn.get("name") if isinstance(fn, dict) else None
    return _openai_policy(body, tools, choice, named, "tool_choice.function.name", "tool")


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
    named = choice.get("name") if isinstance(choice, dict) else None
    return _openai_policy(body, tools, choice, named, "tool_choice", "function tool")


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


def apply_tools(req: pb.GenerateRequest, policy: ToolPolicy | None) -> None:
    """Fills ``GenerateRequest.tools`` / ``tool_choice`` from the policy (1:1 with the proto).

    Args:
        req: the engine request (modified in place).
        policy: the parsed policy, or None (no tool fields).
    Raises:
        ApiError: 400 ``tool_choice`` when a call is required but no tool is declared.
    """
    if policy is None:
        return
    if not policy.tools and policy.choice == "required":
        raise invalid("tool_choice", "requires at least one declared tool")
    for t in policy.tools:
        params = "" if t.parameters is None else json.dumps(t.parameters, ensure_ascii=False)
        req.tools.append(pb.Tool(name=t.name, description=t.description, parameters_json=params, strict=t.strict))
    tc = req.tool_choice
    tc.mode = _MODES[policy.choice]
    tc.allowed_names.extend(policy.allowed_names)
    tc.parallel = policy.parallel


_MODES = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "none": pb.TOOL_CHOICE_MODE_NONE,
          "required": pb.TOOL_CHOICE_MODE_REQUIRED}


@dataclass
class Thinking:
    """Reasoning options, 1:1 with ``ThinkingOptions``: ``enabled`` (None = the model's default,
    Qwen3: on) and ``budget_tokens`` (0 = no budget)."""

    enabled: bool | None = None
    budget_tokens: int = 0
    field: str | None = None  # request field that asked for thinking (engine refusals name it)

    def apply(self, req: pb.GenerateRequest) -> None:
        """Sets ``req.thinking`` when anything is asked for."""
        if self.enabled is not None:
            req.thinking.enabled = self.enabled
        if self.budget_tokens:
            req.thinking.budget_tokens = self.budget_tokens


def thinking_object(value: Any, path: str, budget_required: bool = False) -> Thinking:
    """Parses ``{"type": "enabled", "budget_tokens": N}`` / ``{"type": "disabled"}`` (Anthropic's
    ``thinking``; the same object is the NInfer extension ``thinking`` on Chat Completions and
    Responses).

    Args:
        value: the field value.
        path: its request field path (for errors).
        budget_required: Anthropic requires ``budget_tokens`` with ``enabled``.
    Raises:
        ApiError: 400 naming ``path.type`` / ``path.budget_tokens`` for malformed values.
    """
    if not isinstance(value, dict):
        raise invalid(path, f"expected an object, got {type(value).__name__}")
    ttype = value.get("type")
    if ttype == "disabled":
        extra = [k for k, v in value.items() if k != "type" and v is not None]
        if extra:
            raise invalid(f"{path}.{extra[0]}", "is not allowed with type disabled")
        return Thinking(enabled=False, field=f"{path}.type")
    if ttype != "enabled":
        raise invalid(f"{path}.type", f"expected enabled or disabled, got {ttype!r}")
    extra = [k for k, v in value.items() if k not in ("type", "budget_tokens") and v is not None]
    if extra:
        raise invalid(f"{path}.{extra[0]}", "unknown key; expected type, budget_tokens")
    budget = value.get("budget_tokens")
    if budget is None:
        if budget_required:
            raise invalid(f"{path}.budget_tokens", "is required")
        return Thinking(enabled=True, field=f"{path}.type")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise invalid(f"{path}.budget_tokens", f"expected a positive integer, got {budget!r}")
    return Thinking(enabled=True, budget_tokens=budget, field=f"{path}.type")


def openai_thinking(body: dict) -> Thinking:
    """Thinking options of a Chat Completions / Responses body.

    * ``thinking: {"type": "enabled", "budget_tokens": N} | {"type": "disabled"}`` — the NInfer
      extension (Anthropic's shape; the budget forces the canonical reasoning close after N tokens);
    * ``chat_template_kwargs: {"enable_thinking": bool}`` — vLLM's / SGLang's convention for Qwen3
      (only that key: the gateway adds nothing hidden to the template).

    Raises:
        ApiError: 400 for malformed values or when both are given and disagree.
    """
    out = Thinking()
    if body.get("thinking") is not None:
        out = thinking_object(body["thinking"], "thinking")
    ctk = body.get("chat_template_kwargs")
    if ctk is not None:
        if not isinstance(ctk, dict):
            raise invalid("chat_template_kwargs", "expected an object")
        extra = [k for k, v in ctk.items() if k != "enable_thinking" and v is not None]
        if extra:
            raise invalid(f"chat_template_kwargs.{extra[0]}", "is not supported (only enable_thinking)",
                          "NotSupported")
        flag = ctk.get("enable_thinking")
        if flag is not None:
            if not isinstance(flag, bool):
                raise invalid("chat_template_kwargs.enable_thinking", f"expected a boolean, got {flag!r}")
            if out.enabled is not None and out.enabled != flag:
                raise invalid("chat_template_kwargs.enable_thinking", "contradicts thinking.type")
            out.enabled = flag
            out.field = out.field or "chat_template_kwargs.enable_thinking"
    return out


def call_id(prefix: str = "call_") -> str:
    """A response-unique tool call id (the engine's ``call_0`` ids are unique only within a turn;
    ids come back in later turns' histories, so the gateway makes them globally unique)."""
    return prefix + uuid.uuid4().hex[:24]


def arguments_text(value: Any, path: str) -> str:
    """A history tool call's arguments: JSON object text (OpenAI) or an object (Anthropic ``input``);
    returns compact JSON text. Raises ApiError 400 naming ``path`` when it is not a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise invalid(path, f"is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise invalid(path, "expected a JSON object")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
