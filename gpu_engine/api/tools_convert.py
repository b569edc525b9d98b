"""``ninfer.v1`` tools / tool_choice / thinking / tool messages -> the transport-free frontend types
(:mod:`ninfer_common.frontends`). Protocol types stop here (STYLE "generated protobuf types stop at the
servicer edge")."""
from __future__ import annotations

from typing import Any

from ninfer.v1 import generation_pb2 as pb
from ninfer_common.errors import RequestError
from ninfer_common.frontends import ToolChoice, ToolDef, parse_tools
from ninfer_common.frontends.plan import ThinkingRequest

_MODES = {pb.TOOL_CHOICE_MODE_UNSPECIFIED: "auto", pb.TOOL_CHOICE_MODE_AUTO: "auto",
          pb.TOOL_CHOICE_MODE_NONE: "none", pb.TOOL_CHOICE_MODE_REQUIRED: "required"}
_CONSTRAINTS = {pb.TOOL_CONSTRAINT_MODE_UNSPECIFIED: "basic", pb.TOOL_CONSTRAINT_MODE_BASIC: "basic",
                pb.TOOL_CONSTRAINT_MODE_AUTOMATIC: "automatic"}


def tools_of(msg: pb.GenerateRequest) -> tuple[ToolDef, ...]:
    """The declared tools (order kept).

    Raises:
        FrontendError: bad or duplicate names, parameters that are not JSON (located ``/tools/i/...``).
    """
    return parse_tools([(t.name, t.description, t.parameters_json, t.strict) for t in msg.tools])


def tool_choice_of(msg: pb.GenerateRequest) -> ToolChoice | None:
    """The call policy, or None when the request sets none.

    Raises:
        RequestError: an unknown enum value (InvalidRequest at ``/tool_choice``).
    """
    if not msg.HasField("tool_choice"):
        return None
    tc = msg.tool_choice
    if tc.mode not in _MODES or tc.constraints not in _CONSTRAINTS:
        raise RequestError("InvalidRequest", f"unknown tool_choice mode {tc.mode} / constraints {tc.constraints}",
                           "/tool_choice")
    return ToolChoice(mode=_MODES[tc.mode], allowed_names=tuple(tc.allowed_names),
                      parallel=tc.parallel if tc.HasField("parallel") else True, constraints=_CONSTRAINTS[tc.constraints])


def thinking_of(msg: pb.GenerateRequest) -> ThinkingRequest:
    """``enabled`` None when unset (the model's default); ``budget_tokens`` 0 = none."""
    th = msg.thinking
    return ThinkingRequest(enabled=th.enabled if th.HasField("enabled") else None, budget_tokens=int(th.budget_tokens))


def chat_messages_of(chat: pb.Chat) -> list[dict[str, Any]]:
    """Chat turns as template dicts: ``role``, ``content`` and, where set, ``tool_calls``
    (``[{"name", "arguments"}]``, arguments as JSON text), ``tool_call_id``, ``name``, ``reasoning``."""
    out = []
    for m in chat.messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments_json or "{}"} for c in m.tool_calls]
        for key in ("tool_call_id", "name", "reasoning"):
            if getattr(m, key):
                d[key] = getattr(m, key)
        out.append(d)
    return out


def uses_tools_or_thinking(msg: pb.GenerateRequest) -> bool:
    """The request sets any tool / thinking field (else the plain path applies unchanged)."""
    return bool(msg.tools) or msg.HasField("tool_choice") or msg.HasField("thinking") or (
        msg.WhichOneof("input") == "chat" and any(m.tool_calls or m.role == "tool" for m in msg.chat.messages))
