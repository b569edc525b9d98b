"""gRPC status mapping shared by both servers (the engine's public servicer and the sidecar).

A request error is answered by aborting the RPC with a non-OK status whose
``grpc-status-details-bin`` trailer holds a ``google.rpc.Status`` with one
packed error-detail message: ``ninfer.v1.ErrorDetail`` on the public API,
``ninfer.constraint.v1.ConstraintErrorDetail`` on the sidecar's internal one::

    context.abort_with_status(rpc_status_of(err, ErrorDetail))

Clients decode it with their own code (``clients.errors``); the engine decodes
the sidecar's detail with :func:`detail_from_rpc_error`.
"""
from __future__ import annotations

from typing import TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

from .errors import ServingError, Status

__all__ = ["DETAILS_KEY", "detail_from_rpc_error", "grpc_code", "make_rpc_status", "rpc_status_of", "status_of_code"]

#: The trailer key that carries the serialized ``google.rpc.Status``.
DETAILS_KEY = "grpc-status-details-bin"

M = TypeVar("M", bound=Message)


def grpc_code(status: Status) -> grpc.StatusCode:
    """The gRPC code of a transport-free :class:`Status` (same canonical name)."""
    return grpc.StatusCode[status.value]


def status_of_code(code: grpc.StatusCode) -> Status:
    """The :class:`Status` of a gRPC code (``INTERNAL`` for codes with no project meaning)."""
    try:
        return Status(code.name)
    except ValueError:
        return Status.INTERNAL


def make_rpc_status(code: grpc.StatusCode, detail: Message, message: str | None = None) -> grpc.Status:
    """Builds a ``grpc.Status`` carrying ``detail`` in the rich-error trailer.

    Usable by any server: ``context.abort_with_status(make_rpc_status(...))``.

    Args:
        code: the gRPC status code (must not be OK).
        detail: the detail message to pack (``ErrorDetail`` or the sidecar's
            ``ConstraintErrorDetail``); a ``code`` field, where the type has one and it is
            empty, is filled with ``code.name`` (on a copy).
        message: the status message; defaults to ``detail.message``.
    Returns:
        A ``grpc.Status`` with ``code``, ``details`` and ``trailing_metadata``.
    Raises:
        ValueError: if ``code`` is OK.
    """
    if code == grpc.StatusCode.OK:
        raise ValueError("make_rpc_status needs a non-OK status code")
    if "code" in detail.DESCRIPTOR.fields_by_name and not getattr(detail, "code"):
        filled = type(detail)()
        filled.CopyFrom(detail)
        filled.code = code.name
        detail = filled
    packed = any_pb2.Any()
    packed.Pack(detail)
    rich = status_pb2.Status(code=code.value[0], message=detail.message if message is None else message,
                             details=[packed])
    from grpc_status import rpc_status

    return rpc_status.to_status(rich)


def rpc_status_of(err: ServingError, detail_type: type[M]) -> grpc.Status:
    """The ``grpc.Status`` answering ``err``: its status's gRPC code and a ``detail_type``
    message with ``kind``, ``message``, ``location`` (and ``code`` where the type has one)."""
    code = grpc_code(err.status)
    fields = {"kind": str(err.kind), "message": err.message, "location": err.location}
    if "code" in detail_type.DESCRIPTOR.fields_by_name:
        fields["code"] = code.name
    return make_rpc_status(code, detail_type(**fields))


def detail_from_rpc_error(err: grpc.RpcError, detail_type: type[M]) -> M | None:
    """The first ``detail_type`` message packed in ``err``'s rich status, or None.

    Args:
        err: a ``grpc.RpcError`` that is also a ``grpc.Call``.
        detail_type: the generated message class to look for.
    """
    rich = None
    try:
        from grpc_status import rpc_status

        rich = rpc_status.from_call(err)
    except (ValueError, ImportError, AttributeError, TypeError):
        rich = None
    if rich is None:
        try:
            trailers = err.trailing_metadata() or ()
        except Exception:  # noqa: BLE001 - not a Call
            return None
        for key, value in trailers:
            if key == DETAILS_KEY:
                try:
                    rich = status_pb2.Status.FromString(value)
                except Exception:  # noqa: BLE001 - malformed trailer
                    return None
    if rich is None:
        return None
    for any_msg in rich.details:
        if any_msg.Is(detail_type.DESCRIPTOR):
            detail = detail_type()
            any_msg.Unpack(detail)
            return detail
    return None
