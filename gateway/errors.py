"""Gateway errors and their rendering in each protocol's own error shape.

One exception type, :class:`ApiError`, is raised by every request translator;
``app.py`` renders it as

* OpenAI (Chat Completions, Responses, models):
  ``{"error": {"message", "type", "param", "code"}}`` — the shape the
  ``openai`` SDK turns into ``BadRequestError`` / ``NotFoundError`` / ...;
* Anthropic (Messages, count_tokens): ``{"type": "error", "error": {"type", "message"}}``.

Engine errors (``ninfer.v1.ErrorDetail``) carry a ``location``: a JSON Pointer
into the schema for schema errors, ``line:col`` for grammars/regexes. Seed 000
§errors asks the protocol layer to map that back to the original request field
path (``response_format.json_schema.schema.properties.a``, ``text.format.schema…``,
``output_config.format.schema…``); :func:`field_path` does that.
"""
from __future__ import annotations

import json
import re
from typing import Any

import grpc

#: HTTP status -> OpenAI error ``type``.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable_error",
                 504: "timeout_error"}
#: HTTP status -> Anthropic error ``type`` (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error",
                    504: "api_error"}

#: gRPC status -> HTTP status for engine rejections.
GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class ApiError(Exception):
    """A request error, rendered in the protocol's error shape by the app.

    Attributes:
        status: HTTP status (400, 401, 404, 405, 413, 429, 500, 503, ...).
        message: human-readable message; names the request field path when
            there is one (the SDKs show only the message).
        param: the request field path (``"response_format.json_schema.schema.required"``)
            or None.
        code: machine-readable kind (``"InvalidSchema"``, ``"NotSupported"``, ...) or None.
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def openai_body(self) -> dict:
        """``{"error": {"message", "type", "param", "code"}}`` (OpenAI's error object)."""
        etype = _OPENAI_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": etype, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """``{"type": "error", "error": {"type", "message"}}`` (Anthropic's error object)."""
        etype = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": etype, "message": self.message}}


def shown(value: Any, limit: int = 80) -> str:
    """A request value as the client wrote it (JSON text, cut to ``limit`` chars) for error messages:
    ``null`` / ``true`` / ``["u"]``, never Python's ``None`` / ``True`` / ``['u']``."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def invalid(param: str | None, message: str, code: str = "InvalidRequest") -> ApiError:
    """A 400 whose message starts with the field path: ``"<param>: <message>"``."""
    return ApiError(400, f"{param}: {message}" if param else message, param, code)


def not_supported(param: str, why: str = "is not supported yet by the NInfer engine API") -> ApiError:
    """A 400 for a field the public gRPC API cannot carry (never silently ignored)."""
    return ApiError(400, f"{param}: {why}", param, "NotSupported")


_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def field_path(base: str, pointer: str, document: Any = None) -> str:
    """Maps a JSON Pointer inside a request field to a request field path.

    Args:
        base: the field that holds the document, e.g. ``"response_format.json_schema.schema"``.
        pointer: RFC 6901 pointer into that document (``"/properties/a/items/0"``); ``""`` = the root.
        document: the document, used to tell array indices (``[0]``) from object keys.
    Returns:
        ``"response_format.json_schema.schema.properties.a.items[0]"``; keys that are not
        identifiers are written as ``["odd key"]``.
    """
    if not pointer or not pointer.startswith("/"):
        return base
    out = base
    node = document
    for raw in pointer[1:].split("/"):
        token = _unescape(raw)
        if isinstance(node, list) and token.isdigit():
            out += f"[{token}]"
            idx = int(token)
            node = node[idx] if idx < len(node) else None
            continue
        out += f".{token}" if _IDENT.match(token) else f"[{json.dumps(token)}]"
        node = node.get(token) if isinstance(node, dict) else None
    return out


def engine_rejection(code: grpc.StatusCode, kind: str, message: str, location: str,
                     constraint_field: str | None = None, document: Any = None) -> ApiError:
    """Turns an engine rejection (gRPC status + ``ErrorDetail``) into an :class:`ApiError`.

    Args:
        code: the gRPC status of the rejection.
        kind: ``ErrorDetail.kind`` (``"UnsupportedSchema"``, ``"InvalidGrammar"``, ...).
        message: ``ErrorDetail.message``.
        location: JSON Pointer (schema errors) or ``"line:col"`` (grammar/regex) or ``""``.
        constraint_field: the request field that supplied the constraint
            (``"response_format.json_schema.schema"``), or None.
        document: the schema document (to render array indices), or None.
    Returns:
        The error; its status comes from :data:`GRPC_TO_HTTP` (500 for other codes).
    """
    status = GRPC_TO_HTTP.get(code, 500)
    param = None
    is_constraint_error = kind not in ("InvalidRequest", "") and constraint_field is not None
    if is_constraint_error:
        if location.startswith("/") or location == "":
            param = field_path(constraint_field, location, document)
            text = f"{kind} at {param}: {message}"
        else:  # line:col in a grammar / regex
            param = constraint_field
            text = f"{kind} at {param} ({location}): {message}"
    else:
        text = f"{kind}: {message}" if kind else message
    return ApiError(status, text, param, kind or None)
