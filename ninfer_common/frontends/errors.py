"""Errors of the model frontends (seed 000 §错误), in the project hierarchy (:mod:`ninfer_common.errors`).

:class:`FrontendError` is a request error found before queueing (bad tools, an unsupported
tool_choice/constraint combination, thinking on a model without a thinking stage);
:class:`DecodeIntegrityError` is a runtime bug: a grammar-complete tool call that the decoder cannot
decode with the same contract (seed 000 §工具: "属于实现不一致，不能回落成普通 content").
"""
from __future__ import annotations

from ninfer_common.errors import ErrorKind, RequestError, RowError, Status

#: Kinds a FrontendError can carry (the public ErrorDetail.kind values).
FRONTEND_ERROR_KINDS = frozenset({ErrorKind.INVALID_REQUEST, ErrorKind.INVALID_SCHEMA, ErrorKind.UNSUPPORTED_SCHEMA,
                                  ErrorKind.UNSATISFIABLE_SCHEMA})


class FrontendError(RequestError):
    """A request error (``INVALID_ARGUMENT``).

    Attributes:
        kind: one of :data:`FRONTEND_ERROR_KINDS`.
        message: human readable, says expected vs actual.
        location: a JSON Pointer into the request (``/tools/1/function/parameters/properties/days``) or ``""``.

    Raises:
        ValueError: ``kind`` is not a frontend error kind.
    """

    def __init__(self, kind: ErrorKind | str, message: str, location: str = "") -> None:
        if kind not in FRONTEND_ERROR_KINDS:
            raise ValueError(f"unknown FrontendError kind {kind!r}")
        super().__init__(kind, message, location, Status.INVALID_ARGUMENT)


class DecodeIntegrityError(RowError):
    """The grammar accepted a complete call the decoder cannot decode (``INTERNAL``, kind ``IntegrityError``)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(ErrorKind.INTEGRITY_ERROR, message, "", Status.INTERNAL)
