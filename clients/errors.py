"""Structured NInfer errors as the client library sees them.

Servers reject a request before it is queued by aborting the RPC with a
non-OK status whose ``grpc-status-details-bin`` trailer holds a
``google.rpc.Status`` with one packed ``ninfer.v1.ErrorDetail`` (built by the
servers with ``ninfer_common.grpc_status``). The client turns such an RPC error
back into an exception with :func:`exception_from_rpc_error`; this module only
decodes (it depends on the generated stubs, never on server code).
"""

from __future__ import annotations

import grpc
from google.rpc import status_pb2

from ninfer.v1 import generation_pb2

ErrorDetail = generation_pb2.ErrorDetail

#: The trailer key that carries the serialized ``google.rpc.Status``.
DETAILS_KEY = "grpc-status-details-bin"

#: Status codes that mean "the server could not be reached / did not answer".
UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: Status codes that mean "the request itself was refused" (client error).
REJECTION_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)

_DEFAULT_KIND = {
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidRequest",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.UNAVAILABLE: "ServerUnavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.CANCELLED: "Cancelled",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "InternalError",
    grpc.StatusCode.UNKNOWN: "UnknownError",
}


class NInferError(Exception):
    """Base class of client-side NInfer errors.

    Attributes:
        code: gRPC status name, e.g. ``"INVALID_ARGUMENT"``.
        kind: machine-readable kind, e.g. ``"InvalidGrammar"``.
        message: human-readable message.
        location: ``"line:col"``, a JSON Pointer, or ``""``.
    """

    def __init__(self, code: str, kind: str, message: str, location: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind
        self.message = message
        self.location = location

    def to_dict(self) -> dict:
        """Returns ``{"code", "kind", "message", "location"}``."""
        return {"code": self.code, "kind": self.kind, "message": self.message, "location": self.location}

    def __str__(self) -> str:
        return format_error(self.to_dict())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, kind={self.kind!r}, "
            f"message={self.message!r}, location={self.location!r})"
        )


class RequestRejected(NInferError):
    """The server (or the client's own validation) refused the request before
    it was queued: INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...
    The CLI maps it to exit code 2."""


class ServerUnavailable(NInferError):
    """The server could not be reached or did not answer in time
    (UNAVAILABLE, DEADLINE_EXCEEDED). The CLI maps it to exit code 1."""


class ServerError(NInferError):
    """Any other RPC failure (INTERNAL, UNKNOWN, UNIMPLEMENTED, a stream that
    ended without a finish message, ...). The CLI maps it to exit code 1."""


def format_error(error: dict) -> str:
    """Formats an error dict as ``"<kind> at <location>: <message>"``
    (``"<kind>: <message>"`` when there is no location)."""
    kind = error.get("kind") or error.get("code") or "Error"
    loc = error.get("location") or ""
    msg = error.get("message") or ""
    return f"{kind} at {loc}: {msg}" if loc else f"{kind}: {msg}"


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    """The ``google.rpc.Status`` in ``err``'s trailer, or None."""
    try:
        from grpc_status import rpc_status

        return rpc_status.from_call(err)
    except ValueError:
        pass  # code/message mismatch between trailer and status: decode leniently
    except (ImportError, AttributeError, TypeError):
        pass
    try:
        trailers = err.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - not a Call (e.g. a plain RpcError)
        return None
    for key, value in trailers:
        if key == DETAILS_KEY:
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # noqa: BLE001 - malformed trailer
                return None
    return None


def error_detail_from_rpc_error(err: grpc.RpcError) -> ErrorDetail | None:
    """Extracts the packed ``ninfer.v1.ErrorDetail`` from an RPC error.

    Args:
        err: a ``grpc.RpcError`` that is also a ``grpc.Call``.
    Returns:
        The first ``ErrorDetail`` found in the status details, or None.
    """
    rich = _rich_status(err)
    if rich is None:
        return None
    for any_msg in rich.details:
        if any_msg.Is(ErrorDetail.DESCRIPTOR):
            detail = ErrorDetail()
            any_msg.Unpack(detail)
            return detail
    return None


def exception_from_rpc_error(err: grpc.RpcError) -> NInferError:
    """Maps a ``grpc.RpcError`` to a :class:`NInferError` subclass.

    UNAVAILABLE / DEADLINE_EXCEEDED give :class:`ServerUnavailable`; the
    client-error codes (INVALID_ARGUMENT, FAILED_PRECONDITION,
    RESOURCE_EXHAUSTED, ...) give :class:`RequestRejected`; everything else
    gives :class:`ServerError`. ``kind``, ``message`` and ``location`` come
    from the packed ``ErrorDetail`` when present.

    Args:
        err: the RPC error.
    Returns:
        The exception (not raised).
    """
    try:
        status = err.code()
    except Exception:  # noqa: BLE001
        status = grpc.StatusCode.UNKNOWN
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    try:
        details = err.details() or ""
    except Exception:  # noqa: BLE001
        details = str(err)
    detail = error_detail_from_rpc_error(err)
    kind = (detail.kind if detail is not None else "") or _DEFAULT_KIND.get(status, status.name.title().replace("_", ""))
    message = (detail.message if detail is not None and detail.message else details)
    location = detail.location if detail is not None else ""
    if status in UNAVAILABLE_CODES:
        cls = ServerUnavailable
    elif status in REJECTION_CODES:
        cls = RequestRejected
    else:
        cls = ServerError
    return cls(status.name, kind, message, location)


__all__ = [
    "DETAILS_KEY",
    "ErrorDetail",
    "NInferError",
    "RequestRejected",
    "ServerError",
    "ServerUnavailable",
    "error_detail_from_rpc_error",
    "exception_from_rpc_error",
    "format_error",
]
