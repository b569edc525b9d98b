"""Errors of the model frontends (seed 000 §错误).

:class:`FrontendError` is a request error found before queueing (bad tools, an
unsupported tool_choice/constraint combination, thinking on a model without a
thinking stage); :class:`DecodeIntegrityError` is a runtime bug: a
grammar-complete tool call that the decoder cannot decode with the same
contract (seed 000 §工具: "属于实现不一致，不能回落成普通 content").
"""
from __future__ import annotations

#: Kinds a FrontendError can carry (the public ErrorDetail.kind values).
FRONTEND_ERROR_KINDS = frozenset({"InvalidRequest", "InvalidSchema", "UnsupportedSchema", "UnsatisfiableSchema"})


class FrontendError(Exception):
    """A request error (gRPC INVALID_ARGUMENT).

    Attributes:
        kind: one of :data:`FRONTEND_ERROR_KINDS`.
        message: human readable, says expected vs actual.
        location: a JSON Pointer into the request (``/tools/1/function/parameters/properties/days``)
            or ``""``.
    """

    def __init__(self, kind: str, message: str, location: str = "") -> None:
        if kind not in FRONTEND_ERROR_KINDS:
            raise ValueError(f"unknown FrontendError kind {kind!r}")
        self.kind, self.message, self.location = kind, message, location
        super().__init__(f"{kind}{' at ' + location if location else ''}: {message}")

    def __reduce__(self):
        return (type(self), (self.kind, self.message, self.location))


class DecodeIntegrityError(Exception):
    """The grammar accepted a complete call the decoder cannot decode (gRPC INTERNAL, kind IntegrityError)."""

    kind = "IntegrityError"
