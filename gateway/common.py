"""Translation helpers shared by the three protocols: field checks with request paths,
body constraints, sampling parameters, finish reasons and the NInfer extension field.

Seed 000 (protocol table, §"入口"): one source of body constraint per request
(a standard response format *or* the NInfer ``structured_outputs`` extension,
never both); ``strict`` never licenses ignoring schema keywords; no hidden
system prompt; no ``guided_*`` aliases.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Mapping

from clients.client import build_chat
from ninfer.v1 import generation_pb2 as pb

from .engine import ConstraintOrigin
from .errors import ApiError, invalid, not_supported, shown

#: NInfer extension key on the final response / final SSE event (seed 000: the constraint
#: object of the final result — kind, complete, terminated, cache).
EXTENSION_KEY = "ninfer"
UINT64 = 1 << 64


def new_id(prefix: str) -> str:
    """``prefix`` + 24 hex chars (``chatcmpl-…``, ``resp_…``, ``msg_…``)."""
    return prefix + uuid.uuid4().hex[:24]


def now_s() -> int:
    """Unix time in whole seconds."""
    return int(time.time())


def reject_unknown(body: Mapping[str, Any], allowed: set[str], prefix: str = "") -> None:
    """400 for any present, non-null field outside ``allowed`` — never silently ignored."""
    for key, value in body.items():
        if key not in allowed and value is not None:
            raise not_supported(prefix + key)


def get_str(body: Mapping[str, Any], key: str, path: str, required: bool = False) -> str | None:
    """A string field or None; 400 naming ``path`` for another type or a missing required field."""
    v = body.get(key)
    if v is None:
        if required:
            raise invalid(path, "is required")
        return None
    if not isinstance(v, str):
        raise invalid(path, f"expected a string, got {type(v).__name__}")
    return v


def get_number(body: Mapping[str, Any], key: str, path: str, lo: float, hi: float,
               lo_open: bool = False) -> float | None:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``) or None; 400 otherwise."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid(path, f"expected a number, got {shown(v)}")
    if v > hi or v < lo or (lo_open and v == lo):
        raise invalid(path, f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}")
    return float(v)


def get_int(body: Mapping[str, Any], key: str, path: str, lo: int, hi: int, required: bool = False) -> int | None:
    """An integer in ``[lo, hi]`` or None; 400 otherwise."""
    v = body.get(key)
    if v is None:
        if required:
            raise invalid(path, "is required")
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(path, f"expected an integer, got {shown(v)}")
    if not lo <= v <= hi:
        raise invalid(path, f"must be in [{lo}, {hi}], got {v}")
    return v


def get_bool(body: Mapping[str, Any], key: str, path: str) -> bool:
    """A boolean field (absent/null = False); 400 for another type."""
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise invalid(path, f"expected a boolean, got {shown(v)}")
    return v


def get_dict(body: Mapping[str, Any], key: str, path: str) -> dict | None:
    """An object field or None; 400 for another type."""
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise invalid(path, f"expected an object, got {type(v).__name__}")
    return v


def get_list(body: Mapping[str, Any], key: str, path: str, required: bool = False) -> list | None:
    """An array field or None; 400 for another type or an empty required array."""
    v = body.get(key)
    if v is None:
        if required:
            raise invalid(path, "is required")
        return None
    if not isinstance(v, list):
        raise invalid(path, f"expected an array, got {type(v).__name__}")
    if required and not v:
        raise invalid(path, "must not be empty")
    return v


def check_model(body: Mapping[str, Any], served: str) -> str:
    """The requested model; ``default`` means the served model; another name is a 404
    (as vLLM). Returns the served model's name for the response."""
    name = get_str(body, "model", "model", required=True)
    if name not in (served, "default"):
        raise ApiError(404, f"The model `{name}` does not exist. This server serves `{served}` "
                            f"(alias `default`).", "model", "model_not_found")
    return served


def json_schema_constraint(schema: Any, path: str) -> tuple[dict, ConstraintOrigin]:
    """A JSON Schema body constraint (kept whole: ``strict`` never loosens it).

    Args:
        schema: the schema document (object or boolean).
        path: request field path of the schema, for error mapping.
    Returns:
        ``({"json_schema": "<json text>"}, origin)``.
    Raises:
        ApiError: 400 when the schema is missing or not an object/boolean.
    """
    if schema is None:
        raise invalid(path, "is required")
    if not isinstance(schema, (dict, bool)):
        raise invalid(path, f"expected a JSON Schema object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema, ensure_ascii=False)
    except RecursionError:
        raise invalid(path, "the schema nests too deeply") from None
    return {"json_schema": text}, ConstraintOrigin(path, schema)


def structured_outputs(body: Mapping[str, Any], other_source: str | None) -> tuple[dict, ConstraintOrigin] | None:
    """The NInfer extension ``structured_outputs: {grammar | regex | choice}``.

    Args:
        body: the request body.
        other_source: the standard response-format field present in the body, if any
            (giving both is a 400: one source of body constraint, seed 000).
    Returns:
        ``(constraint dict, origin)`` or None when the extension is absent.
    """
    so = get_dict(body, "structured_outputs", "structured_outputs")
    if so is None:
        return None
    if other_source is not None:
        raise invalid("structured_outputs", f"cannot be combined with {other_source}: a request has one "
                                            "source of body constraint", "ConflictingConstraints")
    present = [k for k, v in so.items() if v is not None]
    unknown = [k for k in present if k not in ("grammar", "regex", "choice")]
    if unknown:
        raise invalid(f"structured_outputs.{unknown[0]}", "unknown key; expected exactly one of grammar, regex, "
                                                         "choice")
    if len(present) != 1:
        raise invalid("structured_outputs", f"expected exactly one of grammar, regex, choice; got {present}")
    kind = present[0]
    value = so[kind]
    path = f"structured_outputs.{kind}"
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
            raise invalid(path, "expected an array of strings")
        if not value:
            raise invalid(path, "must not be empty")
    elif not isinstance(value, str):
        raise invalid(path, "expected a string")
    return {kind: value}, ConstraintOrigin(path)


def build_request(messages: list[dict], *, max_tokens: int | None, sampling: dict[str, Any],
                  constraint: dict | None, policy=None, thinking=None) -> pb.GenerateRequest:
    """Builds the engine ``GenerateRequest`` for a chat conversation.

    Args:
        messages: ``[{"role": "system"|"user"|"assistant"|"tool", "content": str, "tool_calls"?,
            "tool_call_id"?, "name"?, "reasoning"?}]`` (:func:`clients.client.build_chat`).
        policy: a :class:`gateway.tools.ToolPolicy` or None.
        thinking: a :class:`gateway.tools.Thinking` or None.
        max_tokens: generated-token limit (None = engine default).
        sampling: ``temperature``, ``top_p``, ``top_k``, ``seed``, ``presence_penalty``,
            ``frequency_penalty`` (None entries are left unset).
        constraint: a :func:`clients.client.build_constraint` dict or None.
    """
    from clients.client import build_constraint

    req = pb.GenerateRequest(request_id=uuid.uuid4().hex)
    req.chat.CopyFrom(build_chat(messages))
    if max_tokens is not None:
        req.max_tokens = max_tokens
    s = req.sampling
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if sampling.get(name) is not None:
            setattr(s, name, float(sampling[name]))
    if sampling.get("top_k") is not None:
        s.top_k = int(sampling["top_k"])
    if sampling.get("seed") is not None:
        s.seed = int(sampling["seed"]) % UINT64  # OpenAI allows negative seeds; map onto uint64
    oc = build_constraint(constraint)
    if oc is not None:
        req.constraint.CopyFrom(oc)
    from .tools import apply_tools

    apply_tools(req, policy)
    if thinking is not None:
        thinking.apply(req)
    return req


def error_origin(origin: ConstraintOrigin | None, policy, thinking=None) -> ConstraintOrigin | None:
    """The error-mapping origin of a request with a body constraint ``origin``, tools ``policy`` and
    thinking options ``thinking`` (:class:`gateway.tools.Thinking` or None)."""
    tools = list(policy.tools) if policy is not None and policy.tools else []
    thinking_field = thinking.field if thinking is not None and thinking.enabled else None
    if not tools and thinking_field is None:
        return origin
    if origin is None:
        return ConstraintOrigin(None, None, tools, thinking_field)
    return ConstraintOrigin(origin.field, origin.document, tools, thinking_field)


def chat_count_request(messages: list[dict]) -> pb.CountTokensRequest:
    """``CountTokensRequest`` for a chat (rendered with the chat template and a generation prompt).

    The public ``CountTokensRequest`` carries no tools / thinking options, so tool declarations
    are not counted (the messages, tool calls and results in the history are)."""
    req = pb.CountTokensRequest()
    req.chat.CopyFrom(build_chat(messages))
    return req


def extension(result) -> dict:
    """The NInfer extension object of a final response: ``{"constraint": {kind, complete,
    terminated, cache, prepare_seconds} | None}``."""
    return {"constraint": result.constraint}


def runtime_error(result) -> ApiError:
    """An :class:`ApiError` for a generation that ended with ``finish_reason == "error"``
    (after admission): 400 for request-level constraint failures (e.g. ConstraintDeadEnd),
    503 when the constraint service is down, else 500."""
    err = result.error or {}
    code, kind = err.get("code", "INTERNAL"), err.get("kind", "InternalError")
    status = 400 if code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE") else (
        503 if code == "UNAVAILABLE" else 500)
    return ApiError(status, f"{kind}: {err.get('message', '')}", None, kind)


def text_of_parts(content: Any, path: str, text_types: tuple[str, ...], hints: tuple[str, ...] = ()) -> str:
    """Joins a message's text content: a string, or an array of text parts of ``text_types``.

    ``hints`` are part keys that do not change what the model sees (Anthropic ``cache_control``,
    Responses ``annotations`` of earlier output); any other key is a 400.

    Raises:
        ApiError: 400 naming ``path[i].type`` for non-text parts (images, audio, files: the engine
            serves a text-only model) or malformed parts.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(path, f"expected a string or an array of content parts, got {type(content).__name__}")
    out = []
    for i, part in enumerate(content):
        p = f"{path}[{i}]"
        if not isinstance(part, dict):
            raise invalid(p, "expected a content part object")
        ptype = part.get("type")
        if ptype not in text_types:
            raise not_supported(f"{p}.type", f"content part type {shown(ptype)} is not supported yet by the NInfer "
                                             f"engine API (text only: {', '.join(text_types)})")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid(f"{p}.text", "expected a string")
        extra = [k for k, v in part.items() if k not in ("type", "text", *hints) and v is not None]
        if extra:
            raise not_supported(f"{p}.{extra[0]}")
        out.append(text)
    return "".join(out)
